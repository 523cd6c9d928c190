//! A container's confinement beyond its mounts, from its securityContext: a read-only root file
//! system, capabilities (the container runtime's default set, `drop`, `add`, `privileged`),
//! no_new_privs, and the runAsNonRoot check the kubelet makes before starting anything.
//!
//! [`Sandbox`] is computed before fork; [`Sandbox::apply_root`] and [`Sandbox::apply_caps`] run in
//! the child between fork and exec and make only raw system calls.

use k8s_openapi::api::core::v1::{PodSecurityContext, SecurityContext};

/// The capabilities a container runtime grants a root container by default (containerd, CRI-O).
const DEFAULT_CAPS: &[(&str, u32)] = &[
    ("CHOWN", 0),
    ("DAC_OVERRIDE", 1),
    ("FOWNER", 3),
    ("FSETID", 4),
    ("KILL", 5),
    ("SETGID", 6),
    ("SETUID", 7),
    ("SETPCAP", 8),
    ("NET_BIND_SERVICE", 10),
    ("NET_RAW", 13),
    ("SYS_CHROOT", 18),
    ("MKNOD", 27),
    ("AUDIT_WRITE", 29),
    ("SETFCAP", 31),
];

/// Every capability number the kernel may know (CAP_LAST_CAP is 40 on current kernels).
const LAST_CAP: u32 = 63;

fn cap_number(name: &str) -> Option<u32> {
    let name = name.trim_start_matches("CAP_");
    DEFAULT_CAPS
        .iter()
        .chain(&[
            ("DAC_READ_SEARCH", 2),
            ("LINUX_IMMUTABLE", 9),
            ("NET_BROADCAST", 11),
            ("NET_ADMIN", 12),
            ("IPC_LOCK", 14),
            ("IPC_OWNER", 15),
            ("SYS_MODULE", 16),
            ("SYS_RAWIO", 17),
            ("SYS_PTRACE", 19),
            ("SYS_PACCT", 20),
            ("SYS_ADMIN", 21),
            ("SYS_BOOT", 22),
            ("SYS_NICE", 23),
            ("SYS_RESOURCE", 24),
            ("SYS_TIME", 25),
            ("SYS_TTY_CONFIG", 26),
            ("LEASE", 28),
            ("AUDIT_CONTROL", 30),
            ("MAC_OVERRIDE", 32),
            ("MAC_ADMIN", 33),
            ("SYSLOG", 34),
            ("WAKE_ALARM", 35),
            ("BLOCK_SUSPEND", 36),
            ("AUDIT_READ", 37),
            ("PERFMON", 38),
            ("BPF", 39),
            ("CHECKPOINT_RESTORE", 40),
        ])
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| *v)
}

/// What the child applies to itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sandbox {
    pub read_only_root: bool,
    /// Capabilities kept (bounding, permitted, effective, inheritable); None keeps all (privileged).
    pub caps: Option<u64>,
    pub no_new_privs: bool,
}

impl Sandbox {
    pub fn of(sc: Option<&SecurityContext>) -> Sandbox {
        let privileged = sc.and_then(|s| s.privileged) == Some(true);
        let caps = (!privileged).then(|| {
            let mut keep: u64 = DEFAULT_CAPS.iter().map(|(_, n)| 1u64 << n).sum();
            let spec = sc.and_then(|s| s.capabilities.as_ref());
            for name in spec.and_then(|c| c.drop.as_ref()).into_iter().flatten() {
                if name.eq_ignore_ascii_case("ALL") {
                    keep = 0;
                } else if let Some(n) = cap_number(name) {
                    keep &= !(1u64 << n);
                }
            }
            for name in spec.and_then(|c| c.add.as_ref()).into_iter().flatten() {
                if name.eq_ignore_ascii_case("ALL") {
                    keep = u64::MAX;
                } else if let Some(n) = cap_number(name) {
                    keep |= 1u64 << n;
                }
            }
            keep
        });
        Sandbox {
            read_only_root: sc.and_then(|s| s.read_only_root_filesystem) == Some(true),
            caps,
            no_new_privs: sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
        }
    }

    /// Makes every mount of the container's namespace read-only (before its volumes are mounted).
    /// Runs in the forked child.
    pub fn apply_root(&self) -> std::io::Result<()> {
        if !self.read_only_root {
            return Ok(());
        }
        set_read_only(c"/", true)
    }

    /// A writable volume bind-mounted from inside the read-only root inherits its read-only flag;
    /// this clears it again. Runs in the forked child.
    pub fn writable_volume(&self, target: &std::ffi::CStr) -> std::io::Result<()> {
        if !self.read_only_root {
            return Ok(());
        }
        set_read_only(target, false)
    }

    /// Drops the bounding set to the kept capabilities (before the user changes) and sets
    /// no_new_privs. Runs in the forked child.
    pub fn apply_bounding(&self) -> std::io::Result<()> {
        if let Some(keep) = self.caps {
            for cap in 0..=LAST_CAP {
                if keep & (1u64 << cap) == 0 {
                    // SAFETY: prctl with integer arguments; EINVAL past the kernel's last cap.
                    let rc = unsafe {
                        libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0)
                    };
                    if rc != 0
                        && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL)
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                }
            }
        }
        if self.no_new_privs {
            // SAFETY: prctl with integer arguments.
            if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// Narrows the permitted, effective and inheritable sets of a process still running as root
    /// (a non-root user lost them at setuid already). Runs in the forked child, after setuid.
    pub fn apply_caps(&self) -> std::io::Result<()> {
        let Some(keep) = self.caps else {
            return Ok(());
        };
        #[repr(C)]
        struct Header {
            version: u32,
            pid: libc::c_int,
        }
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        const VERSION_3: u32 = 0x2008_0522;
        let mut header = Header {
            version: VERSION_3,
            pid: 0,
        };
        let mut data = [Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        // SAFETY: capget(2) into a version-3 header and two data structs, as the ABI requires.
        if unsafe {
            libc::syscall(
                libc::SYS_capget,
                &mut header as *mut Header,
                data.as_mut_ptr(),
            )
        } != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        let (lo, hi) = (keep as u32, (keep >> 32) as u32);
        for (d, mask) in data.iter_mut().zip([lo, hi]) {
            d.effective &= mask;
            d.permitted &= mask;
            d.inheritable &= mask;
        }
        // SAFETY: capset(2) with the structs filled above.
        if unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) }
            != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// mount_setattr(2) on `path` and every mount below it: read-only on or off.
fn set_read_only(path: &std::ffi::CStr, read_only: bool) -> std::io::Result<()> {
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    const AT_RECURSIVE: libc::c_uint = 0x8000;
    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    let attr = MountAttr {
        attr_set: if read_only { MOUNT_ATTR_RDONLY } else { 0 },
        attr_clr: if read_only { 0 } else { MOUNT_ATTR_RDONLY },
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: mount_setattr(2) with a valid path and a properly sized attribute struct.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The kubelet's runAsNonRoot check, made before a container starts: None to go ahead, or the
/// kubelet's own message. `uid` is the user the container will run as (spec, else the image's).
pub fn run_as_non_root_refusal(
    pod_sc: Option<&PodSecurityContext>,
    sc: Option<&SecurityContext>,
    uid: Option<u32>,
    pod: &str,
    container: &str,
) -> Option<String> {
    let required = sc
        .and_then(|s| s.run_as_non_root)
        .or(pod_sc.and_then(|s| s.run_as_non_root))
        == Some(true);
    if !required || uid.is_some_and(|u| u != 0) {
        return None;
    }
    Some(format!(
        "container has runAsNonRoot and image will run as root (pod: {pod:?}, container: {container})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sc(v: serde_json::Value) -> SecurityContext {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn capabilities_start_from_the_runtime_default_then_drop_and_add() {
        let default = Sandbox::of(None).caps.unwrap();
        assert_ne!(default & (1 << 13), 0, "NET_RAW is a default");
        assert_eq!(default & (1 << 21), 0, "SYS_ADMIN is not");
        let none = Sandbox::of(Some(&sc(
            serde_json::json!({"capabilities": {"drop": ["ALL"]}}),
        )));
        assert_eq!(none.caps, Some(0));
        let some = Sandbox::of(Some(&sc(serde_json::json!({
            "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE", "CAP_SYS_ADMIN"]},
            "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
        }))));
        assert_eq!(some.caps, Some((1 << 10) | (1 << 21)));
        assert!(some.read_only_root && some.no_new_privs);
        let privileged = Sandbox::of(Some(&sc(serde_json::json!({"privileged": true}))));
        assert_eq!(privileged.caps, None);
    }

    #[test]
    fn run_as_non_root_refuses_root_and_an_unknown_user() {
        let yes = sc(serde_json::json!({"runAsNonRoot": true}));
        let msg = run_as_non_root_refusal(None, Some(&yes), Some(0), "ns/p(u1)", "c").unwrap();
        assert_eq!(
            msg,
            "container has runAsNonRoot and image will run as root (pod: \"ns/p(u1)\", container: c)"
        );
        assert!(run_as_non_root_refusal(None, Some(&yes), None, "p", "c").is_some());
        assert!(run_as_non_root_refusal(None, Some(&yes), Some(65532), "p", "c").is_none());
        let pod: PodSecurityContext =
            serde_json::from_value(serde_json::json!({"runAsNonRoot": true})).unwrap();
        assert!(run_as_non_root_refusal(Some(&pod), None, Some(0), "p", "c").is_some());
        assert!(run_as_non_root_refusal(None, None, Some(0), "p", "c").is_none());
    }
}
