//! Readiness probes: tcpSocket, httpGet (plain HTTP) and exec, each bounded by timeoutSeconds.

use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::process::{Launch, spawn};

/// How one probe attempt is carried out.
#[derive(Debug, Clone)]
pub enum ProbeAction {
    Tcp {
        ip: IpAddr,
        port: u16,
    },
    Http {
        ip: IpAddr,
        port: u16,
        path: String,
        host: String,
    },
    Exec(Box<Launch>),
}

/// Resolves a port given by number or by the name of one of the container's ports.
pub fn resolve_port(port: &IntOrString, container: &Container) -> Option<u16> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).ok(),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .or_else(|| name.parse().ok()),
    }
}

/// Turns a probe spec into an action; None when it declares no supported handler. `exec_base` is
/// the container's launch, whose mounts, user and environment an exec probe shares.
pub fn action(
    probe: &Probe,
    container: &Container,
    pod_ip: IpAddr,
    exec_base: &Launch,
) -> Option<ProbeAction> {
    if let Some(tcp) = &probe.tcp_socket {
        let ip = tcp
            .host
            .as_deref()
            .and_then(|h| h.parse().ok())
            .unwrap_or(pod_ip);
        return Some(ProbeAction::Tcp {
            ip,
            port: resolve_port(&tcp.port, container)?,
        });
    }
    if let Some(http) = &probe.http_get {
        let ip = http
            .host
            .as_deref()
            .and_then(|h| h.parse().ok())
            .unwrap_or(pod_ip);
        let port = resolve_port(&http.port, container)?;
        return Some(ProbeAction::Http {
            ip,
            port,
            path: http.path.clone().unwrap_or_else(|| "/".into()),
            host: format!("{ip}:{port}"),
        });
    }
    if let Some(exec) = &probe.exec {
        let command = exec.command.clone().unwrap_or_default();
        let (program, args) = command.split_first()?;
        let path_var = exec_base
            .env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.as_str())
            .unwrap_or("/usr/bin:/bin");
        let mut launch = exec_base.clone();
        launch.program = crate::process::find_program(program, path_var)?;
        launch.args = args.to_vec();
        launch.log_file = None;
        return Some(ProbeAction::Exec(Box::new(launch)));
    }
    None
}

/// Runs one attempt; true when the probe succeeded within `timeout`.
pub async fn run(action: &ProbeAction, timeout: Duration) -> bool {
    let attempt = async {
        match action {
            ProbeAction::Tcp { ip, port } => connect(*ip, *port).await.is_some(),
            ProbeAction::Http {
                ip,
                port,
                path,
                host,
            } => http_ok(*ip, *port, path, host).await,
            ProbeAction::Exec(launch) => match spawn(launch) {
                Ok(mut child) => {
                    let ok = matches!(child.wait().await, Ok(s) if s.success());
                    if !ok {
                        let _ = child.start_kill();
                    }
                    ok
                }
                Err(_) => false,
            },
        }
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .unwrap_or(false)
}

/// Connects to a listener, refusing a TCP self-connect: with no listener on an ephemeral port, the
/// kernel may pick that very port as the source and the "connection" succeeds through a
/// simultaneous open with itself (seen once in CI), which would report a dead pod as Ready.
async fn connect(ip: IpAddr, port: u16) -> Option<tokio::net::TcpStream> {
    let stream = tokio::net::TcpStream::connect((ip, port)).await.ok()?;
    let local = stream.local_addr().ok()?;
    let peer = stream.peer_addr().ok()?;
    (local != peer).then_some(stream)
}

/// A GET whose status is 200-399, as the kubelet counts success.
async fn http_ok(ip: IpAddr, port: u16, path: &str, host: &str) -> bool {
    let Some(mut stream) = connect(ip, port).await else {
        return false;
    };
    let request =
        format!("GET {path} HTTP/1.0\r\nHost: {host}\r\nUser-Agent: ferry-node-agent\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    // Only the status line matters; read at most 64 bytes of it.
    let mut buf = [0u8; 64];
    let mut len = 0;
    while len < buf.len() {
        match stream.read(&mut buf[len..]).await {
            Ok(0) | Err(_) => break,
            Ok(n) => len += n,
        }
        if buf[..len].contains(&b'\n') {
            break;
        }
    }
    let line = String::from_utf8_lossy(&buf[..len]);
    let code = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok());
    matches!(code, Some(200..=399))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tcp_and_http_probes_follow_the_listener() {
        // An address of its own (like a pod's), so no other test can take over the port once the
        // listener is gone and make the last check pass by accident.
        let pid = std::process::id();
        let ip = IpAddr::V4(std::net::Ipv4Addr::new(
            127,
            91,
            (pid >> 8) as u8,
            (pid as u8).max(2),
        ));
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            for status in ["200 OK", "503 Service Unavailable"] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 512];
                let _ = s.read(&mut buf).await.unwrap();
                let resp = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n");
                s.write_all(resp.as_bytes()).await.unwrap();
            }
        });
        let http = ProbeAction::Http {
            ip,
            port,
            path: "/ready".into(),
            host: "x".into(),
        };
        assert!(run(&http, Duration::from_secs(2)).await);
        assert!(!run(&http, Duration::from_secs(2)).await);
        server.await.unwrap();
        // The listener is gone now: tcp fails.
        assert!(!run(&ProbeAction::Tcp { ip, port }, Duration::from_secs(2)).await);
    }

    #[test]
    fn named_ports_resolve_through_the_container_spec() {
        let container: Container = serde_json::from_value(serde_json::json!({
            "name": "c", "ports": [{"name": "data", "containerPort": 7000}]
        }))
        .unwrap();
        assert_eq!(
            resolve_port(&IntOrString::String("data".into()), &container),
            Some(7000)
        );
        assert_eq!(resolve_port(&IntOrString::Int(81), &container), Some(81));
        assert_eq!(
            resolve_port(&IntOrString::String("nope".into()), &container),
            None
        );
    }
}
