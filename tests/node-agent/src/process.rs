//! Starting a container as a local process with the filesystem view its pod spec declares.
//!
//! The child joins its pod's network namespace, enters a private mount namespace and UTS namespace (between fork and exec) and bind-mounts every volume at
//! its mountPath, so two pods can mount different directories at the same path. Then it drops to the
//! pod's user and groups and changes to the working directory. It leads its own process group, so a
//! signal reaches everything it started.
//!
//! Mount points that do not exist on the host are created there as empty directories (or files), since
//! the private namespace shares the host's root filesystem; their contents exist only inside the pod.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("failed to prepare mount point {path}")]
    MountPoint {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to open log file {path}")]
    Log {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("path {path:?} contains a NUL byte")]
    Nul { path: String },
    #[error("failed to start {program} for container {container}")]
    Spawn {
        program: String,
        container: String,
        #[source]
        source: std::io::Error,
    },
}

/// One bind mount in the container's namespace.
#[derive(Debug, Clone)]
pub struct BindMount {
    pub source: PathBuf,
    pub target: PathBuf,
    pub read_only: bool,
}

/// What to run and how.
#[derive(Debug, Clone)]
pub struct Launch {
    pub container: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub working_dir: PathBuf,
    pub mounts: Vec<BindMount>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub groups: Vec<u32>,
    /// stdout and stderr go here (appended), or to /dev/null when None.
    pub log_file: Option<PathBuf>,
    /// The hostname the container sees (its own UTS namespace), like a pod's.
    pub hostname: Option<String>,
    /// The pod's network namespace (a file under /run/netns) the container joins; None keeps the
    /// agent's, which is the node's (hostNetwork).
    pub netns: Option<PathBuf>,
    /// Read-only root, capabilities, no_new_privs.
    pub sandbox: crate::sandbox::Sandbox,
}

fn cstring(p: &Path) -> Result<CString, ProcessError> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| ProcessError::Nul {
        path: p.display().to_string(),
    })
}

/// Creates the mount point for `m` on the host if it is missing: a directory for a directory source,
/// an empty file for a file source.
fn ensure_mount_point(m: &BindMount) -> Result<(), ProcessError> {
    let err = |source| ProcessError::MountPoint {
        path: m.target.clone(),
        source,
    };
    if m.target.exists() {
        return Ok(());
    }
    if m.source.is_dir() {
        std::fs::create_dir_all(&m.target).map_err(err)
    } else {
        if let Some(parent) = m.target.parent() {
            std::fs::create_dir_all(parent).map_err(err)?;
        }
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.target)
            .map(drop)
            .map_err(err)
    }
}

/// Starts the process. The returned child leads its own process group (pgid == pid).
pub fn spawn(launch: &Launch) -> Result<tokio::process::Child, ProcessError> {
    // Mount points are created before fork: the child may only make async-signal-safe calls.
    let mut mounts = launch.mounts.clone();
    // Parents before children, so a mount inside another volume lands on top of it.
    mounts.sort_by_key(|m| m.target.components().count());
    for m in &mounts {
        ensure_mount_point(m)?;
    }
    let prepared: Vec<(CString, CString, bool)> = mounts
        .iter()
        .map(|m| Ok((cstring(&m.source)?, cstring(&m.target)?, m.read_only)))
        .collect::<Result<_, ProcessError>>()?;
    let workdir = cstring(&launch.working_dir)?;
    let hostname: Option<Vec<u8>> = launch.hostname.as_ref().map(|h| h.as_bytes().to_vec());
    let groups: Vec<libc::gid_t> = launch.groups.clone();
    let (uid, gid) = (launch.uid, launch.gid);
    let sandbox = launch.sandbox;
    // Opened before fork; the child only calls setns on the descriptor. Closed in the parent when
    // the command is dropped, and on exec in the child.
    let netns = match &launch.netns {
        Some(path) => Some(
            std::fs::File::open(path).map_err(|source| ProcessError::Spawn {
                program: launch.program.display().to_string(),
                container: launch.container.clone(),
                source,
            })?,
        ),
        None => None,
    };

    let mut cmd = tokio::process::Command::new(&launch.program);
    cmd.args(&launch.args)
        .env_clear()
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .process_group(0)
        .kill_on_drop(false);
    match &launch.log_file {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|source| ProcessError::Log {
                    path: path.clone(),
                    source,
                })?;
            let err_file = file.try_clone().map_err(|source| ProcessError::Log {
                path: path.clone(),
                source,
            })?;
            cmd.stdout(Stdio::from(file)).stderr(Stdio::from(err_file));
        }
        None => {
            cmd.stdout(Stdio::null()).stderr(Stdio::null());
        }
    }
    // SAFETY: the closure runs in the forked child before exec and only makes async-signal-safe
    // system calls on data prepared above (no allocation, no locks).
    unsafe {
        cmd.pre_exec(move || {
            if let Some(ns) = &netns
                && libc::setns(std::os::fd::AsRawFd::as_raw_fd(ns), libc::CLONE_NEWNET) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWUTS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(name) = &hostname
                && libc::sethostname(name.as_ptr().cast(), name.len()) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // Keep our mounts from propagating back to the host's namespace.
            let root = c"/";
            if libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // The root goes read-only before the volumes, which keep their own modes.
            sandbox.apply_root()?;
            for (source, target, read_only) in &prepared {
                // A mount point inside another volume may only exist now that the volume is mounted.
                libc::mkdir(target.as_ptr(), 0o755);
                if libc::mount(
                    source.as_ptr(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                if !*read_only {
                    sandbox.writable_volume(target)?;
                }
                if *read_only
                    && libc::mount(
                        std::ptr::null(),
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                        std::ptr::null(),
                    ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            sandbox.apply_bounding()?;
            // Root's supplementary groups must not leak to a non-root container.
            if (uid.is_some() || gid.is_some() || !groups.is_empty())
                && libc::setgroups(groups.len(), groups.as_ptr()) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(g) = gid
                && libc::setgid(g) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(u) = uid
                && libc::setuid(u) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            sandbox.apply_caps()?;
            if libc::chdir(workdir.as_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().map_err(|source| ProcessError::Spawn {
        program: launch.program.display().to_string(),
        container: launch.container.clone(),
        source,
    })
}

/// Sends `signal` to the process group `pgid`; a group that is already gone is not an error.
pub fn signal_group(pgid: i32, signal: i32) {
    if pgid > 1 {
        // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
        unsafe {
            libc::kill(-pgid, signal);
        }
    }
}

/// Finds `program` on `path_var` (a PATH value) when it names no directory.
pub fn find_program(program: &str, path_var: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(PathBuf::from(program));
    }
    path_var
        .split(':')
        .map(|dir| Path::new(dir).join(program))
        .find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn spawned_process_sees_read_only_bind_mount_env_workdir_and_hostname() {
        if unsafe { libc::geteuid() } != 0 {
            panic!("this test needs root (mount namespaces); the CI and dev machines run as root");
        }
        let src = tempfile::tempdir().unwrap();
        let target = tempfile::tempdir().unwrap();
        let mount_at = target.path().join("mnt/volume");
        std::fs::write(src.path().join("hello.txt"), b"from the volume").unwrap();
        let log = target.path().join("out.log");
        let launch = Launch {
            container: "c".into(),
            program: find_program("sh", "/usr/bin:/bin").unwrap(),
            args: vec![
                "-c".into(),
                "cat volume/hello.txt; echo \" $GREETING\"; (echo x > volume/denied) 2>/dev/null || echo read-only; hostname".into(),
            ],
            env: vec![("GREETING".into(), "hi".into()), ("PATH".into(), "/usr/bin:/bin".into())],
            working_dir: target.path().join("mnt"),
            mounts: vec![BindMount {
                source: src.path().to_path_buf(),
                target: mount_at.clone(),
                read_only: true,
            }],
            uid: None,
            gid: None,
            groups: vec![],
            log_file: Some(log.clone()),
            hostname: Some("pod-x".into()),
            netns: None,
            sandbox: crate::sandbox::Sandbox::of(None),
        };
        let mut child = spawn(&launch).unwrap();
        let status = child.wait().await.unwrap();
        assert!(status.success());
        let out = std::fs::read_to_string(&log).unwrap();
        assert_eq!(out, "from the volume hi\nread-only\npod-x\n");
        // The bind mount lived only in the child's namespace: the host's mount point is empty.
        assert_eq!(std::fs::read_dir(&mount_at).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn sandbox_makes_the_root_read_only_keeps_volumes_and_drops_capabilities() {
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "needs root (mount namespaces)"
        );
        // Not under /tmp, which the container gets a private one of.
        let volume = tempfile::tempdir_in("/var/tmp").unwrap();
        let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
        let out = tempfile::tempdir_in("/var/tmp").unwrap();
        let log = out.path().join("out.log");
        let mount_at = volume.path().join("mnt");
        std::fs::create_dir(&mount_at).unwrap();
        let script = format!(
            "touch {root_probe} 2>/dev/null && echo root-writable
             touch /tmp/private 2>/dev/null && echo tmp-writable
             touch {vol}/x && echo volume-writable
             echo x > /dev/null && echo dev-null-ok
             grep -E '^Cap(Eff|Bnd)' /proc/self/status",
            root_probe = out.path().join("root-probe").display(),
            vol = mount_at.display(),
        );
        let launch = Launch {
            container: "c".into(),
            program: find_program("sh", "/usr/bin:/bin").unwrap(),
            args: vec!["-c".into(), script],
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            working_dir: "/".into(),
            mounts: vec![
                BindMount {
                    source: tmp.path().to_path_buf(),
                    target: "/tmp".into(),
                    read_only: true,
                },
                BindMount {
                    source: volume.path().to_path_buf(),
                    target: mount_at.clone(),
                    read_only: false,
                },
            ],
            uid: None,
            gid: None,
            groups: vec![],
            log_file: Some(log.clone()),
            hostname: None,
            netns: None,
            sandbox: crate::sandbox::Sandbox {
                read_only_root: true,
                caps: Some(0),
                no_new_privs: true,
            },
        };
        let status = spawn(&launch).unwrap().wait().await.unwrap();
        assert!(status.success());
        let out_text = std::fs::read_to_string(&log).unwrap();
        assert!(!out_text.contains("root-writable"), "{out_text}");
        assert!(!out_text.contains("tmp-writable"), "{out_text}");
        assert!(out_text.contains("volume-writable"), "{out_text}");
        assert!(out_text.contains("dev-null-ok"), "{out_text}");
        assert!(out_text.contains("CapEff:\t0000000000000000"), "{out_text}");
        assert!(out_text.contains("CapBnd:\t0000000000000000"), "{out_text}");
        assert!(!out.path().join("root-probe").exists());
    }
}
