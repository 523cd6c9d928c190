//! Pod networking: each pod gets a network namespace of its own, named `<node prefix>-<uid>` under
//! `/run/netns` (so `ip netns` shows it), joined to the node's namespace by a veth pair: `eth0` in
//! the pod with the pod's /32 and a default route via the range's gateway address, which sits on the
//! node's end of every pod's veth; the node routes the pod's /32 to that veth. A pod's 127.0.0.1 is
//! its own. The agent runs in the node's namespace, so its probes reach pods as the kubelet's do.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use crate::podip::PodRange;

#[derive(Debug, thiserror::Error)]
pub enum PodNetError {
    #[error("failed to run ip {args}")]
    Spawn {
        args: String,
        #[source]
        source: std::io::Error,
    },
    #[error("ip {args} failed: {stderr}")]
    Failed { args: String, stderr: String },
}

/// What a node's pods' networks are made from.
#[derive(Debug, Clone)]
pub struct NodeNetwork {
    pub node_ip: Ipv4Addr,
    pub range: PodRange,
    /// Pod namespaces are named `<prefix>-<first 8 of the pod's uid>`.
    pub netns_prefix: String,
    /// The cluster DNS Service's address written into pods' resolv.conf; None leaves the node's.
    pub dns: Option<Ipv4Addr>,
    pub cluster_domain: String,
}

/// One pod's network namespace.
#[derive(Debug)]
pub struct PodNetwork {
    pub name: String,
    pub ip: Ipv4Addr,
}

async fn ip(args: &[&str], stdin: Option<&str>) -> Result<(), PodNetError> {
    use tokio::io::AsyncWriteExt as _;
    let shown = args.join(" ");
    let mut cmd = tokio::process::Command::new("ip");
    cmd.args(args)
        .stdin(if stdin.is_some() {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let spawn_err = |source| PodNetError::Spawn {
        args: shown.clone(),
        source,
    };
    let mut child = cmd.spawn().map_err(spawn_err)?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).await.map_err(spawn_err)?;
    }
    let out = child.wait_with_output().await.map_err(spawn_err)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(PodNetError::Failed {
            args: shown,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

impl NodeNetwork {
    fn pod_netns_name(&self, uid: &str) -> String {
        let short: String = uid.chars().filter(|c| *c != '-').take(8).collect();
        format!("{}-{short}", self.netns_prefix)
    }

    /// Creates the pod's namespace and veth. On failure nothing is left behind.
    pub async fn create(&self, uid: &str, pod_ip: Ipv4Addr) -> Result<PodNetwork, PodNetError> {
        let name = self.pod_netns_name(uid);
        // A namespace of this name is a leftover of an earlier run of this pod (an agent crash).
        let _ = ip(&["netns", "del", &name], None).await;
        ip(&["netns", "add", &name], None).await?;
        let pod = PodNetwork { name, ip: pod_ip };
        if let Err(e) = self.wire(&pod).await {
            pod.destroy().await;
            return Err(e);
        }
        Ok(pod)
    }

    async fn wire(&self, pod: &PodNetwork) -> Result<(), PodNetError> {
        let gw = self.range.gateway();
        // The node's end is named after the pod's address (unique on this node, at most 15 bytes).
        let veth = format!("p{}", u32::from(pod.ip));
        let node_side = format!(
            "link add {veth} type veth peer name eth0 netns {ns}\n\
             addr add {gw}/32 dev {veth}\n\
             link set {veth} up\n\
             route add {pod_ip}/32 dev {veth} src {gw}\n",
            ns = pod.name,
            pod_ip = pod.ip,
        );
        ip(&["-batch", "-"], Some(&node_side)).await?;
        let pod_side = format!(
            "link set lo up\n\
             addr add {pod_ip}/32 dev eth0\n\
             link set eth0 up\n\
             route add {gw}/32 dev eth0 scope link\n\
             route add default via {gw} dev eth0\n",
            pod_ip = pod.ip,
        );
        ip(&["-n", &pod.name, "-batch", "-"], Some(&pod_side)).await
    }

    /// Removes every pod namespace of this node: a restarted agent adopts no pods, and processes
    /// left in them belonged to a node that lost power.
    pub async fn remove_stale(&self) {
        let Ok(entries) = std::fs::read_dir("/run/netns") else {
            return;
        };
        let prefix = format!("{}-", self.netns_prefix);
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if name.starts_with(&prefix) {
                kill_processes_in(&name).await;
                let _ = ip(&["netns", "del", &name], None).await;
            }
        }
    }

    /// The pod's `/etc/resolv.conf` for dnsPolicy ClusterFirst, as the kubelet writes it.
    pub fn resolv_conf(&self, namespace: &str) -> Option<String> {
        let dns = self.dns?;
        let d = &self.cluster_domain;
        Some(format!(
            "nameserver {dns}\nsearch {namespace}.svc.{d} svc.{d} {d}\noptions ndots:5\n"
        ))
    }
}

/// The pod's `/etc/hosts`: localhost and the pod's own name, as the kubelet writes it.
pub fn hosts_file(pod_ip: Ipv4Addr, hostname: &str) -> String {
    format!(
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{pod_ip}\t{hostname}\n"
    )
}

async fn kill_processes_in(netns: &str) {
    let Ok(out) = tokio::process::Command::new("ip")
        .args(["netns", "pids", netns])
        .output()
        .await
    else {
        return;
    };
    for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        if let Ok(pid) = pid.parse::<i32>() {
            // SAFETY: kill(2) on a pid read from the kernel; no memory is involved.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

impl PodNetwork {
    /// The namespace file containers join with setns(2).
    pub fn netns_path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// Removes the namespace; its veth pair and the node's route to the pod go with it.
    pub async fn destroy(&self) {
        kill_processes_in(&self.name).await;
        if let Err(e) = ip(&["netns", "del", &self.name], None).await {
            tracing::warn!(netns = %self.name, error = %e, "failed to remove pod network namespace");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net() -> NodeNetwork {
        NodeNetwork {
            node_ip: Ipv4Addr::new(10, 199, 0, 11),
            range: PodRange::parse("10.199.129.0/24").unwrap(),
            netns_prefix: format!("ferrytest{}", std::process::id()),
            dns: Some(Ipv4Addr::new(10, 96, 0, 10)),
            cluster_domain: "cluster.local".into(),
        }
    }

    #[test]
    fn resolv_conf_searches_the_pods_namespace_first() {
        assert_eq!(
            net().resolv_conf("demo").unwrap(),
            "nameserver 10.96.0.10\nsearch demo.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"
        );
        let none = NodeNetwork { dns: None, ..net() };
        assert!(none.resolv_conf("demo").is_none());
    }

    /// Two pods' namespaces on one "node" (a namespace of the test's own): each has its own
    /// loopback, and they reach each other through the node's routes.
    #[tokio::test]
    async fn pods_get_their_own_namespace_address_and_loopback() {
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "needs root (network namespaces)"
        );
        let net = net();
        let node_ns = format!("{}-node", net.netns_prefix);
        ip(&["netns", "add", &node_ns], None).await.unwrap();
        // Run the agent's half inside the node namespace, as the agent does.
        let result = std::thread::spawn({
            let net = net.clone();
            let node_ns = node_ns.clone();
            move || {
                let f = std::fs::File::open(format!("/run/netns/{node_ns}")).unwrap();
                use std::os::fd::AsRawFd as _;
                // SAFETY: setns on a namespace file we opened; affects this thread only.
                assert_eq!(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    ip(&["link", "set", "lo", "up"], None).await.unwrap();
                    // A node forwards between its pods' veths (up.sh sets the same).
                    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").unwrap();
                    let a = net
                        .create("aaaaaaaa-1111", Ipv4Addr::new(10, 199, 129, 2))
                        .await
                        .unwrap();
                    let b = net
                        .create("bbbbbbbb-2222", Ipv4Addr::new(10, 199, 129, 3))
                        .await
                        .unwrap();
                    let sh = |ns: &str, script: &str| {
                        std::process::Command::new("ip")
                            .args(["netns", "exec", ns, "sh", "-c", script])
                            .output()
                            .unwrap()
                    };
                    let addr = sh(&a.name, "ip -4 -o addr show dev eth0");
                    let ping = sh(&a.name, "ping -c1 -W2 10.199.129.3 >/dev/null && echo ok");
                    let lo = sh(&b.name, "ip -4 -o addr show dev lo");
                    a.destroy().await;
                    b.destroy().await;
                    (
                        String::from_utf8_lossy(&addr.stdout).to_string(),
                        String::from_utf8_lossy(&ping.stdout).to_string(),
                        String::from_utf8_lossy(&lo.stdout).to_string(),
                        std::path::Path::new(&format!("/run/netns/{}", a.name)).exists(),
                    )
                })
            }
        })
        .join();
        let _ = ip(&["netns", "del", &node_ns], None).await;
        let (addr, ping, lo, left) = result.unwrap();
        assert!(addr.contains("10.199.129.2/32"), "{addr}");
        assert_eq!(ping.trim(), "ok", "pod a reaches pod b through the node");
        assert!(lo.contains("127.0.0.1/8"), "{lo}");
        assert!(!left, "destroy removes the namespace");
    }
}
