//! The tidy checks' view of Rust source: comments and literals blanked, tokens, the paths a
//! file names (`use` trees expanded), its `#[cfg(test)]` items set aside, and where the files
//! of `mod name;` live. Enough for the checks, no more: it is not a Rust parser.

use std::path::{Path, PathBuf};

pub fn collect_rs(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_file() {
        if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.to_owned());
        }
        return;
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for entry in entries {
        collect_rs(&entry, out);
    }
}

/// The files `mod name;` declared in `file` may live in.
pub fn module_files(file: &Path, name: &str) -> Vec<PathBuf> {
    let dir = file.parent().unwrap();
    let stem = file.file_stem().unwrap();
    let base = if ["lib", "main", "mod"].iter().any(|s| stem == *s) {
        dir.to_owned()
    } else {
        dir.join(stem)
    };
    vec![
        base.join(format!("{name}.rs")),
        base.join(name).join("mod.rs"),
    ]
}

#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    Ident(String),
    /// `::`
    Path,
    Punct(char),
}

/// Every path in `tokens`, with its line: `use` trees expanded to full paths, and the inline
/// paths of the code (identifiers joined by `::`; a leading `::` dropped).
pub fn paths(tokens: &[(usize, Tok)]) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i].1 {
            Tok::Ident(word) if word == "use" => {
                i += 1;
                use_tree(tokens, &mut i, &[], &mut out);
            }
            Tok::Ident(_) | Tok::Path => {
                let line = tokens[i].0;
                let mut path = Vec::new();
                if tokens[i].1 == Tok::Path {
                    i += 1;
                }
                while let Some((_, Tok::Ident(word))) = tokens.get(i) {
                    path.push(word.clone());
                    i += 1;
                    if tokens.get(i).map(|t| &t.1) != Some(&Tok::Path) {
                        break;
                    }
                    i += 1;
                }
                out.push((line, path));
            }
            Tok::Punct(_) => i += 1,
        }
    }
    out
}

/// A `use` tree from `tokens[*i]` on, as full paths (`{a, b::{c}}` expanded), each with the
/// line it is on; stops after the tree (before its `;`, `,` or `}`).
pub fn use_tree(
    tokens: &[(usize, Tok)],
    i: &mut usize,
    prefix: &[String],
    out: &mut Vec<(usize, Vec<String>)>,
) {
    let mut path = prefix.to_vec();
    let mut line = tokens.get(*i).map_or(0, |t| t.0);
    while let Some((at, tok)) = tokens.get(*i) {
        match tok {
            Tok::Ident(word) if word == "as" => {
                *i += 2;
                break;
            }
            Tok::Ident(word) => {
                if path.len() == prefix.len() {
                    line = *at;
                }
                path.push(word.clone());
            }
            Tok::Path => {}
            Tok::Punct('*') => path.push("*".into()),
            Tok::Punct('{') => {
                *i += 1;
                while let Some((_, tok)) = tokens.get(*i) {
                    match tok {
                        Tok::Punct('}') => break,
                        Tok::Punct(',') => *i += 1,
                        _ => use_tree(tokens, i, &path, out),
                    }
                }
                *i += 1;
                return;
            }
            Tok::Punct(_) => break,
        }
        *i += 1;
    }
    out.push((line, path));
}

/// `tokens` without the items under `#[cfg(test)]`, and the names of `#[cfg(test)] mod x;`.
pub fn without_test_items(tokens: &[(usize, Tok)]) -> (Vec<(usize, Tok)>, Vec<String>) {
    let is = |i: usize, want: &[Tok]| {
        tokens.len() >= i + want.len() && tokens[i..i + want.len()].iter().map(|t| &t.1).eq(want)
    };
    let punct = Tok::Punct;
    let ident = |s: &str| Tok::Ident(s.into());
    let cfg_test = [
        punct('['),
        ident("cfg"),
        punct('('),
        ident("test"),
        punct(')'),
        punct(']'),
    ];
    let mut kept = Vec::new();
    let mut modules = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if is(i, &[punct('#'), punct('!')]) && is(i + 2, &cfg_test) {
            return (Vec::new(), Vec::new()); // the whole file is test code
        }
        if !(is(i, &[punct('#')]) && is(i + 1, &cfg_test)) {
            kept.push(tokens[i].clone());
            i += 1;
            continue;
        }
        i += 1 + cfg_test.len();
        // More attributes of the same item.
        while is(i, &[punct('#'), punct('[')]) {
            i = matching(tokens, i + 1);
        }
        let start = i;
        let mut depth = 0usize;
        while i < tokens.len() {
            match tokens[i].1 {
                Tok::Punct('(' | '[') => depth += 1,
                Tok::Punct(')' | ']') => depth = depth.saturating_sub(1),
                Tok::Punct('{') if depth == 0 => {
                    i = matching(tokens, i);
                    break;
                }
                Tok::Punct(';') if depth == 0 => {
                    let item: Vec<&Tok> = tokens[start..i].iter().map(|t| &t.1).collect();
                    if let [.., Tok::Ident(m), Tok::Ident(name)] = item[..] {
                        if m == "mod" {
                            modules.push(name.clone());
                        }
                    }
                    i += 1;
                    break;
                }
                _ => {}
            }
            i += 1;
        }
    }
    (kept, modules)
}

/// The index just past the bracket that closes the one at `open`.
pub fn matching(tokens: &[(usize, Tok)], open: usize) -> usize {
    let mut depth = 0usize;
    for (i, (_, tok)) in tokens.iter().enumerate().skip(open) {
        match tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    tokens.len()
}

/// Identifiers, `::` and other punctuation, each with its 1-based line.
pub fn tokens(text: &str) -> Vec<(usize, Tok)> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            if !c.is_ascii_digit() {
                out.push((line, Tok::Ident(word)));
            }
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push((line, Tok::Path));
            i += 2;
        } else {
            out.push((line, Tok::Punct(c)));
            i += 1;
        }
    }
    out
}

/// `source` with comments, string and character literals turned into spaces (newlines kept,
/// so lines keep their numbers).
pub fn blank_comments_and_literals(source: &str) -> String {
    let s: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let blank = |out: &mut String, chars: &[char]| {
        out.extend(chars.iter().map(|&c| if c == '\n' { '\n' } else { ' ' }));
    };
    let ident_char = |c: char| c.is_alphanumeric() || c == '_';
    let mut i = 0;
    while i < s.len() {
        let prev_ident = i > 0 && ident_char(s[i - 1]);
        let end = match s[i] {
            '/' if s.get(i + 1) == Some(&'/') => {
                let mut j = i;
                while j < s.len() && s[j] != '\n' {
                    j += 1;
                }
                j
            }
            '/' if s.get(i + 1) == Some(&'*') => {
                let (mut j, mut depth) = (i + 2, 1);
                while j < s.len() && depth > 0 {
                    if s[j] == '/' && s.get(j + 1) == Some(&'*') {
                        depth += 1;
                        j += 2;
                    } else if s[j] == '*' && s.get(j + 1) == Some(&'/') {
                        depth -= 1;
                        j += 2;
                    } else {
                        j += 1;
                    }
                }
                j
            }
            // Raw strings: r"..", r#".."#, br#".."#.
            'r' if !prev_ident
                || (i > 0 && s[i - 1] == 'b' && (i < 2 || !ident_char(s[i - 2]))) =>
            {
                let mut j = i + 1;
                while s.get(j) == Some(&'#') {
                    j += 1;
                }
                let hashes = j - i - 1;
                if s.get(j) == Some(&'"') {
                    j += 1;
                    loop {
                        if j >= s.len() {
                            break j;
                        }
                        if s[j] == '"'
                            && s[j + 1..]
                                .iter()
                                .take(hashes)
                                .filter(|&&c| c == '#')
                                .count()
                                == hashes
                        {
                            break j + 1 + hashes;
                        }
                        j += 1;
                    }
                } else {
                    i
                }
            }
            '"' => {
                let mut j = i + 1;
                while j < s.len() && s[j] != '"' {
                    j += if s[j] == '\\' { 2 } else { 1 };
                }
                j + 1
            }
            // A character literal ('x', '\n', '\u{1F600}'), not a lifetime ('a).
            '\'' if s.get(i + 1) == Some(&'\\') => {
                let mut j = i + 3;
                while j < s.len() && s[j] != '\'' {
                    j += 1;
                }
                j + 1
            }
            '\'' if s.get(i + 2) == Some(&'\'') => i + 3,
            _ => i,
        };
        if end > i {
            let end = end.min(s.len());
            blank(&mut out, &s[i..end]);
            i = end;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

/// The modules `tokens` declares in files of their own (`mod name;`), test modules set aside
/// beforehand by [`without_test_items`].
pub fn declared_modules(tokens: &[(usize, Tok)]) -> Vec<String> {
    tokens
        .windows(3)
        .filter_map(|w| match (&w[0].1, &w[1].1, &w[2].1) {
            (Tok::Ident(m), Tok::Ident(name), Tok::Punct(';')) if m == "mod" => Some(name.clone()),
            _ => None,
        })
        .collect()
}
