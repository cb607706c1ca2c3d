//! `slate-init`: the init role alone, for the initramfs `/init` (the profile's `boot.init`).
//! The same code as `slate init`, in a binary a fraction of slate's size: the kernel unpacks
//! less and the first page faults are fewer (docs/node.md, "Boot breakdown").

use std::process::ExitCode;

fn main() -> ExitCode {
    // What the kernel passes after the init path (`single`, `x=1`…), as `slate init` takes it.
    match slate_init::run(std::env::args_os().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
