use std::os::unix::fs::symlink;
use std::sync::Mutex;

use super::*;

struct Tree {
    _tmp: tempfile::TempDir,
    image: PathBuf,
    var: PathBuf,
    user: PathBuf,
    state: PathBuf,
    outside: PathBuf,
    trace: PathBuf,
}

impl Tree {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let image = root.join("usr/lib/slate/setup.d");
        let var = root.join("var");
        let user = var.join("lib/slate/etc-setup-hooks");
        let (state, outside) = (root.join("state"), root.join("outside"));
        for dir in [&image, &user, &state, &outside] {
            fs::create_dir_all(dir).unwrap();
        }
        let trace = root.join("trace");
        Self {
            _tmp: tmp,
            image,
            var,
            user,
            state,
            outside,
            trace,
        }
    }

    fn hook(&self, dir: &Path, name: &str, mode: u32, body: &str) {
        let path = dir.join(name);
        let tag = dir.file_name().unwrap().to_string_lossy();
        let script = format!(
            "#!/bin/sh\necho {tag}/{name} >> '{}'\n{body}\n",
            self.trace.display()
        );
        fs::write(&path, script).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
    }

    fn run(&self) -> (Result<HookReport, EtcError>, Vec<String>) {
        let dirs = [
            HookDir::image(&self.image),
            HookDir::user(&self.user, &self.var),
        ];
        let run = HookRun {
            dirs: &dirs,
            timeout: Duration::from_secs(30),
            state_etc_dir: &self.state,
            version: "2.0.0",
        };
        let lines = Mutex::new(Vec::new());
        let result = run_setup_hooks(
            &run,
            |l| lines.lock().unwrap().push(l.to_owned()),
            &CancelToken::new(),
        );
        (result, lines.into_inner().unwrap())
    }

    fn trace(&self) -> Vec<String> {
        fs::read_to_string(&self.trace)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

fn found(name: &str, dir: usize) -> Found {
    Found {
        name: name.to_owned(),
        dir,
        path: PathBuf::from(name),
        skip: None,
    }
}

#[test]
fn order_is_by_name_then_the_images_hook_first() {
    let ordered = order(vec![
        found("20-b", 1),
        found("10-a", 1),
        found("10-a", 0),
        found("05-z", 1),
        found("Z", 0),
    ]);
    let seen: Vec<(&str, usize)> = ordered.iter().map(|f| (f.name.as_str(), f.dir)).collect();
    // Byte order: digits before upper case.
    assert_eq!(
        seen,
        [("05-z", 1), ("10-a", 0), ("10-a", 1), ("20-b", 1), ("Z", 0)]
    );
}

#[test]
fn both_directories_run_merged_by_name_and_non_executables_are_skipped() {
    let t = Tree::new();
    t.hook(&t.image, "10-image", 0o755, "");
    t.hook(&t.user, "05-user", 0o755, "echo from the user");
    t.hook(&t.user, "10-image", 0o755, "");
    t.hook(&t.user, "30-notes", 0o644, "");
    // A link inside /var to an executable inside /var is a hook.
    t.hook(&t.var, "real", 0o755, "");
    symlink(t.var.join("real"), t.user.join("40-link")).unwrap();
    let (result, lines) = t.run();
    let report = result.unwrap();
    assert_eq!(
        t.trace(),
        [
            "etc-setup-hooks/05-user",
            "setup.d/10-image",
            "etc-setup-hooks/10-image",
            "var/real"
        ]
    );
    assert_eq!(
        report.skipped,
        [("etc-setup-hooks/30-notes".to_owned(), "not executable")]
    );
    assert!(lines.contains(&"etc-setup-hooks/05-user: from the user".to_owned()));
    assert!(
        lines.contains(&"setup hook etc-setup-hooks/30-notes skipped: not executable".to_owned())
    );
    assert_eq!(
        lines.last().unwrap(),
        "setup hooks done for 2.0.0: 4 ran, 1 skipped"
    );
    assert!(!hooks_due(&t.state, "2.0.0").unwrap());
}

#[test]
fn a_user_hook_linking_out_of_var_refuses_the_run_before_any_hook() {
    let t = Tree::new();
    t.hook(&t.image, "10-image", 0o755, "");
    t.hook(&t.outside, "evil", 0o755, "");
    symlink(t.outside.join("evil"), t.user.join("50-evil")).unwrap();
    let (result, lines) = t.run();
    let err = result.unwrap_err().to_string();
    assert!(err.starts_with("setup hooks refused, none ran: "), "{err}");
    assert!(err.contains("50-evil resolves to"), "{err}");
    assert!(
        err.ends_with(&format!("outside {}", t.var.display())),
        "{err}"
    );
    assert_eq!(lines, [err]);
    assert!(t.trace().is_empty(), "a hook ran: {:?}", t.trace());
    assert!(hooks_due(&t.state, "2.0.0").unwrap());

    // A dangling link is refused too: what it names cannot be checked.
    fs::remove_file(t.user.join("50-evil")).unwrap();
    symlink("/nonexistent/hook", t.user.join("50-dangling")).unwrap();
    let err = t.run().0.unwrap_err().to_string();
    assert!(
        err.contains("50-dangling resolves to /nonexistent/hook"),
        "{err}"
    );
}

#[test]
fn a_user_hook_directory_that_is_a_symlink_out_of_var_is_refused() {
    let t = Tree::new();
    t.hook(&t.image, "10-image", 0o755, "");
    t.hook(&t.outside, "20-outside", 0o755, "");
    fs::remove_dir(&t.user).unwrap();
    symlink(&t.outside, &t.user).unwrap();
    let err = t.run().0.unwrap_err().to_string();
    assert!(err.contains("etc-setup-hooks resolves to"), "{err}");
    assert!(t.trace().is_empty());
    // A directory link that stays inside /var is followed.
    fs::remove_file(&t.user).unwrap();
    let inside = t.var.join("hooks-elsewhere");
    fs::create_dir(&inside).unwrap();
    t.hook(&inside, "20-inside", 0o755, "");
    symlink(&inside, &t.user).unwrap();
    t.run().0.unwrap();
    assert_eq!(t.trace(), ["setup.d/10-image", "hooks-elsewhere/20-inside"]);
}

#[test]
fn a_hung_user_hook_is_killed_and_nothing_is_recorded() {
    let t = Tree::new();
    t.hook(&t.user, "10-hang", 0o755, "sleep 30");
    t.hook(&t.user, "20-after", 0o755, "");
    let dirs = [HookDir::user(&t.user, &t.var)];
    let run = HookRun {
        dirs: &dirs,
        timeout: Duration::from_millis(300),
        state_etc_dir: &t.state,
        version: "2.0.0",
    };
    let err = run_setup_hooks(&run, |_| {}, &CancelToken::new()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "setup hook etc-setup-hooks/10-hang failed: timed out after 0.3 s (killed)"
    );
    assert_eq!(t.trace(), ["etc-setup-hooks/10-hang"]);
    assert!(hooks_due(&t.state, "2.0.0").unwrap());
}
