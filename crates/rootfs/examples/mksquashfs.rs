//! `cargo run -p slate-rootfs --example mksquashfs -- SRC_DIR OUT.sqsh`: build an image the
//! way the imager does (epoch from SOURCE_DATE_EPOCH, default 0) and print its stats.

use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args_os().skip(1);
    let (Some(src), Some(out)) = (args.next(), args.next()) else {
        return Err("usage: mksquashfs SRC_DIR OUT.sqsh".into());
    };
    let opts = slate_rootfs::SquashfsOptions::from_env()?;
    let out = PathBuf::from(out);
    let file = BufWriter::new(File::create(&out)?);
    let stats = slate_rootfs::build_squashfs(&PathBuf::from(src), file, &opts)?;
    println!("{}: {stats:?}", out.display());
    Ok(())
}
