//! `ferry-mover clean-staging`: removes the resume state that receivers of one transfer left in
//! a destination's `.ferry-staging/` (the operator runs it when a Transfer is deleted).

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use rustix::fs::AtFlags;
use rustix::io::Errno;

use crate::tree::dest::{list_dir, remove_at};
use crate::tree::peer_path::STAGING_DIR;
use crate::tree::subpath::{self, SubPathError};
use crate::tree::{DestRoot, RelPath};

#[derive(clap::Args, Debug)]
pub struct CleanStagingArgs {
    /// Destination root the receivers wrote to.
    #[arg(long)]
    pub root: PathBuf,
    /// The destination beneath --root (as `receive --sub-path`), opened without following a
    /// symlink.
    #[arg(long, value_name = "REL")]
    pub sub_path: Option<String>,
    /// Remove the staging directories whose transfer id starts with this (for example
    /// `<uid>.` for every run of one Transfer).
    #[arg(long)]
    pub transfer_prefix: String,
}

pub fn run(args: CleanStagingArgs) -> anyhow::Result<ExitCode> {
    let prefix = args.transfer_prefix.as_bytes();
    if prefix.is_empty() || prefix.contains(&b'/') || prefix.starts_with(b".") {
        bail!("--transfer-prefix must be a non-empty transfer id prefix without '/'");
    }
    // Never through a symlink: a tenant could have swapped the destination for one since.
    let sub = subpath::parse(args.sub_path.as_deref().unwrap_or(""))?;
    let anchored = match subpath::open_source(&args.root, sub.as_ref()) {
        Ok(a) => a,
        Err(SubPathError::RootMissing { .. } | SubPathError::Missing { .. }) => {
            eprintln!("{} does not exist: nothing to clean", args.root.display());
            return Ok(ExitCode::SUCCESS);
        }
        Err(SubPathError::NotRegular { .. }) => {
            eprintln!("the sub path is not a directory: nothing to clean");
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e.into()),
    };
    // A sub path naming a file was opened (without following a symlink) when it was resolved:
    // it holds no staging, and its name is not looked up again, where a symlink swapped in
    // since would lead to a directory outside the root. Without a sub path `--root` is trusted
    // as given; with one naming a directory, `effective()` is the handle held since.
    if anchored.file().is_some() || !anchored.effective().is_dir() {
        eprintln!(
            "{} is not a directory: nothing to clean",
            anchored.shown_dir().display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let root = DestRoot::open(&anchored.effective())
        .with_context(|| format!("failed to open {}", anchored.shown_dir().display()))?;
    let staging = RelPath::parse(STAGING_DIR.as_bytes())?;
    let dir = match root.open_dir(Some(&staging)) {
        Ok(d) => d,
        Err(e) if e.errno() == Some(libc::ENOENT) => {
            eprintln!(
                "no {STAGING_DIR} in {}: nothing to clean",
                anchored.shown_dir().display()
            );
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e.into()),
    };
    let mut removed = 0u64;
    for entry in list_dir(dir.as_fd())? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name.starts_with(prefix) {
            remove_at(dir.as_fd(), name).with_context(|| {
                format!(
                    "failed to remove {STAGING_DIR}/{}",
                    String::from_utf8_lossy(name)
                )
            })?;
            removed += 1;
        }
    }
    // The staging directory goes too once no other transfer uses it.
    match rustix::fs::unlinkat(root.root().as_fd(), STAGING_DIR, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOTEMPTY | Errno::EXIST | Errno::NOENT) => {}
        Err(e) => return Err(e).context(format!("failed to remove {STAGING_DIR}")),
    }
    println!("{{\"removed\":{removed}}}");
    Ok(ExitCode::SUCCESS)
}
