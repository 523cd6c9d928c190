//! Probes with the kubelet's semantics: startup, liveness and readiness, each a tcpSocket, httpGet
//! (HTTP or HTTPS without verification, as the kubelet), grpc (grpc.health.v1 over h2c) or exec
//! handler, bounded by timeoutSeconds. [`Prober`] keeps one probe's counters and turns results into
//! what the runner must do; it is pure, so its thresholds are tested without processes.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
        https: bool,
        headers: Vec<(String, String)>,
    },
    Grpc {
        ip: IpAddr,
        port: u16,
        service: String,
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

/// Turns a probe spec into an action, or says why the agent cannot run it. `exec_base` is the
/// container's launch, whose mounts, user, environment and network an exec probe shares.
pub fn action(
    probe: &Probe,
    container: &Container,
    pod_ip: IpAddr,
    exec_base: &Launch,
) -> Result<ProbeAction, String> {
    if let Some(grpc) = &probe.grpc {
        let port = u16::try_from(grpc.port).map_err(|_| format!("grpc port {}", grpc.port))?;
        return Ok(ProbeAction::Grpc {
            ip: pod_ip,
            port,
            service: grpc.service.clone().unwrap_or_default(),
        });
    }
    handler(probe, container, pod_ip, exec_base).ok_or_else(|| {
        "the probe names no handler the node agent can run (or its port or program is unknown)"
            .to_string()
    })
}

fn handler(
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
        let headers: Vec<(String, String)> = http
            .http_headers
            .iter()
            .flatten()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect();
        let host = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("host"))
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| format!("{ip}:{port}"));
        let https = match http.scheme.as_deref() {
            None | Some("HTTP") => false,
            Some("HTTPS") => true,
            Some(_) => return None,
        };
        return Some(ProbeAction::Http {
            ip,
            port,
            path: http.path.clone().unwrap_or_else(|| "/".into()),
            host,
            https,
            headers: headers
                .into_iter()
                .filter(|(k, _)| !k.eq_ignore_ascii_case("host"))
                .collect(),
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
                https,
                headers,
            } => {
                let request = http_request(path, host, headers);
                let Some(stream) = connect(*ip, *port).await else {
                    return false;
                };
                if *https {
                    match tls_connect(*ip, stream).await {
                        Some(tls) => http_ok(tls, &request).await,
                        None => false,
                    }
                } else {
                    http_ok(stream, &request).await
                }
            }
            ProbeAction::Grpc { ip, port, service } => {
                grpc_serving(*ip, *port, service).await.unwrap_or(false)
            }
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

fn http_request(path: &str, host: &str, headers: &[(String, String)]) -> String {
    let mut request =
        format!("GET {path} HTTP/1.0\r\nHost: {host}\r\nUser-Agent: kube-probe/1.35\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    request
}

/// A GET whose status is 200-399, as the kubelet counts success.
async fn http_ok<S: AsyncReadExt + AsyncWriteExt + Unpin>(mut stream: S, request: &str) -> bool {
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

/// The kubelet does not verify a probed server's certificate; neither does this.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _: &rustls_pki_types::CertificateDer<'_>,
        _: &[rustls_pki_types::CertificateDer<'_>],
        _: &rustls_pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

async fn tls_connect(
    ip: IpAddr,
    stream: tokio::net::TcpStream,
) -> Option<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .ok()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    connector
        .connect(rustls_pki_types::ServerName::IpAddress(ip.into()), stream)
        .await
        .ok()
}

/// grpc.health.v1.Health/Check over plaintext HTTP/2: true when the answer is SERVING.
async fn grpc_serving(ip: IpAddr, port: u16, service: &str) -> Option<bool> {
    let stream = connect(ip, port).await?;
    let (client, connection) = h2::client::handshake(stream).await.ok()?;
    let driver = tokio::spawn(connection);
    let result = async {
        let mut client = client.ready().await.ok()?;
        let request =
            http::Request::post(format!("http://{ip}:{port}/grpc.health.v1.Health/Check"))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(())
                .ok()?;
        let (response, mut body) = client.send_request(request, false).ok()?;
        body.send_data(grpc_frame(&health_check_request(service)), true)
            .ok()?;
        let response = response.await.ok()?;
        if response.status() != http::StatusCode::OK {
            return Some(false);
        }
        let mut body = response.into_body();
        let mut data = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.ok()?;
            let _ = body.flow_control().release_capacity(chunk.len());
            data.extend_from_slice(&chunk);
            if data.len() > 4096 {
                return Some(false);
            }
        }
        let trailers = body.trailers().await.ok()?;
        let status_ok = trailers
            .as_ref()
            .and_then(|t| t.get("grpc-status"))
            .is_some_and(|v| v == "0");
        Some(status_ok && health_status(&data) == Some(SERVING))
    }
    .await;
    driver.abort();
    result
}

const SERVING: u64 = 1;

/// HealthCheckRequest { string service = 1; } in protobuf.
fn health_check_request(service: &str) -> Vec<u8> {
    if service.is_empty() {
        return Vec::new();
    }
    let mut out = vec![0x0a];
    put_varint(&mut out, service.len() as u64);
    out.extend_from_slice(service.as_bytes());
    out
}

/// A gRPC message frame: uncompressed flag, big-endian length, message.
fn grpc_frame(message: &[u8]) -> bytes::Bytes {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out.into()
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// HealthCheckResponse { ServingStatus status = 1; } from one gRPC frame; None when malformed.
fn health_status(frame: &[u8]) -> Option<u64> {
    let (header, message) = frame.split_at_checked(5)?;
    if header[0] != 0 || u32::from_be_bytes(header[1..5].try_into().ok()?) as usize != message.len()
    {
        return None;
    }
    // An empty message is status 0 (UNKNOWN); otherwise field 1, varint.
    let mut status = 0;
    let mut rest = message;
    while let Some((&tag, tail)) = rest.split_first() {
        let (value, used) = varint(tail)?;
        if tag != 0x08 {
            return None;
        }
        status = value;
        rest = &tail[used..];
    }
    Some(status)
}

fn varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, b) in bytes.iter().enumerate().take(10) {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

/// Which probe this is: they differ in what their verdicts do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    Startup,
    Liveness,
    Readiness,
}

#[derive(Debug, Clone, Copy)]
pub struct ProbeTiming {
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: i32,
    pub failure_threshold: i32,
}

impl ProbeTiming {
    /// The spec's timing with the kubelet's defaults (period 10 s, timeout 1 s, thresholds 1/3).
    pub fn of(probe: &Probe) -> Self {
        let secs = |v: Option<i32>, d: u64| {
            Duration::from_secs(v.and_then(|v| u64::try_from(v).ok()).unwrap_or(d))
        };
        ProbeTiming {
            initial_delay: secs(probe.initial_delay_seconds, 0),
            period: secs(probe.period_seconds, 10).max(Duration::from_secs(1)),
            timeout: secs(probe.timeout_seconds, 1).max(Duration::from_secs(1)),
            success_threshold: probe.success_threshold.unwrap_or(1).max(1),
            failure_threshold: probe.failure_threshold.unwrap_or(3).max(1),
        }
    }
}

/// What a probe result asks of the runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Nothing,
    Ready(bool),
    /// The startup probe succeeded: liveness and readiness probes start.
    Started,
    /// Kill the container (the restart policy decides what follows), with the reason.
    Restart(String),
}

/// One probe of one container: its action, timing and counters.
#[derive(Debug, Clone)]
pub struct Prober {
    pub kind: ProbeKind,
    pub action: ProbeAction,
    pub timing: ProbeTiming,
    next: Instant,
    successes: i32,
    failures: i32,
}

impl Prober {
    pub fn new(kind: ProbeKind, action: ProbeAction, timing: ProbeTiming) -> Self {
        Prober {
            kind,
            action,
            timing,
            next: Instant::now(),
            successes: 0,
            failures: 0,
        }
    }

    /// A container (re)started at `now`: counters cleared, first run after the initial delay.
    pub fn reset(&mut self, now: Instant) {
        self.successes = 0;
        self.failures = 0;
        self.next = now + self.timing.initial_delay;
    }

    pub fn due(&self, now: Instant) -> bool {
        now >= self.next
    }

    /// Counts one result (taken at `now`) and says what follows from it.
    pub fn record(&mut self, ok: bool, now: Instant) -> Verdict {
        self.next = now + self.timing.period;
        if ok {
            self.failures = 0;
            self.successes = self.successes.saturating_add(1);
        } else {
            self.successes = 0;
            self.failures = self.failures.saturating_add(1);
        }
        let passed = self.successes >= self.timing.success_threshold;
        let failed = self.failures >= self.timing.failure_threshold;
        match self.kind {
            ProbeKind::Readiness if passed => Verdict::Ready(true),
            ProbeKind::Readiness if failed => Verdict::Ready(false),
            ProbeKind::Startup if ok => Verdict::Started,
            ProbeKind::Startup | ProbeKind::Liveness if failed => {
                let what = if self.kind == ProbeKind::Startup {
                    "Startup"
                } else {
                    "Liveness"
                };
                Verdict::Restart(format!(
                    "{what} probe failed {} times in a row; the container will be restarted",
                    self.failures
                ))
            }
            _ => Verdict::Nothing,
        }
    }
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
            https: false,
            headers: vec![("X-Probe".into(), "1".into())],
        };
        assert!(run(&http, Duration::from_secs(2)).await);
        assert!(!run(&http, Duration::from_secs(2)).await);
        server.await.unwrap();
        // The listener is gone now: tcp fails.
        assert!(fails_soon(&ProbeAction::Tcp { ip, port }).await);
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

    /// True once a run of `action` fails, within 5 s. A closed listener can keep accepting for a
    /// moment: a process another test forks holds a copy of its descriptor until it execs.
    async fn fails_soon(action: &ProbeAction) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if !run(action, Duration::from_secs(2)).await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    fn timing(success: i32, failure: i32) -> ProbeTiming {
        ProbeTiming {
            initial_delay: Duration::from_secs(5),
            period: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            success_threshold: success,
            failure_threshold: failure,
        }
    }

    fn prober(kind: ProbeKind, success: i32, failure: i32) -> Prober {
        let ip = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
        Prober::new(
            kind,
            ProbeAction::Tcp { ip, port: 1 },
            timing(success, failure),
        )
    }

    #[test]
    fn liveness_restarts_only_after_consecutive_failures() {
        let now = Instant::now();
        let mut p = prober(ProbeKind::Liveness, 1, 3);
        p.reset(now);
        assert!(!p.due(now), "the initial delay holds the first run");
        assert!(p.due(now + Duration::from_secs(5)));
        assert_eq!(p.record(false, now), Verdict::Nothing);
        assert_eq!(p.record(false, now), Verdict::Nothing);
        assert_eq!(p.record(true, now), Verdict::Nothing, "a success resets");
        assert_eq!(p.record(false, now), Verdict::Nothing);
        assert_eq!(p.record(false, now), Verdict::Nothing);
        assert!(matches!(p.record(false, now), Verdict::Restart(m) if m.starts_with("Liveness")));
        assert!(
            !p.due(now + Duration::from_millis(500)),
            "next run after the period"
        );
    }

    #[test]
    fn startup_reports_started_on_success_and_restarts_after_its_threshold() {
        let now = Instant::now();
        let mut p = prober(ProbeKind::Startup, 1, 2);
        assert_eq!(p.record(false, now), Verdict::Nothing);
        assert_eq!(p.record(true, now), Verdict::Started);
        p.reset(now);
        assert_eq!(p.record(false, now), Verdict::Nothing);
        assert!(matches!(p.record(false, now), Verdict::Restart(m) if m.starts_with("Startup")));
    }

    #[test]
    fn readiness_follows_its_thresholds() {
        let now = Instant::now();
        let mut p = prober(ProbeKind::Readiness, 2, 2);
        assert_eq!(p.record(true, now), Verdict::Nothing);
        assert_eq!(p.record(true, now), Verdict::Ready(true));
        assert_eq!(p.record(false, now), Verdict::Nothing);
        assert_eq!(p.record(false, now), Verdict::Ready(false));
    }

    /// An address of the test's own in 127/8, so a port freed by one test is not another's.
    fn own_ip(salt: u8) -> IpAddr {
        let pid = std::process::id();
        IpAddr::V4(std::net::Ipv4Addr::new(
            127,
            92 + salt,
            (pid >> 8) as u8,
            (pid as u8).max(2),
        ))
    }

    #[tokio::test]
    async fn https_probe_accepts_a_self_signed_server_and_reads_its_status() {
        let ip = own_ip(0);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["pod".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let mut requests = Vec::new();
            for status in ["204 No Content", "500 Internal Server Error"] {
                let (s, _) = listener.accept().await.unwrap();
                let mut tls = acceptor.accept(s).await.unwrap();
                let mut buf = [0u8; 512];
                let n = tls.read(&mut buf).await.unwrap();
                requests.push(String::from_utf8_lossy(&buf[..n]).to_string());
                let resp = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n");
                tls.write_all(resp.as_bytes()).await.unwrap();
                let _ = tls.shutdown().await;
            }
            requests
        });
        let https = ProbeAction::Http {
            ip,
            port,
            path: "/healthz".into(),
            host: "example".into(),
            https: true,
            headers: vec![("X-Probe".into(), "yes".into())],
        };
        assert!(run(&https, Duration::from_secs(5)).await);
        assert!(!run(&https, Duration::from_secs(5)).await);
        let requests = server.await.unwrap();
        assert!(
            requests[0].starts_with("GET /healthz HTTP/1.0\r\n"),
            "{requests:?}"
        );
        assert!(requests[0].contains("Host: example\r\n"), "{requests:?}");
        assert!(requests[0].contains("X-Probe: yes\r\n"), "{requests:?}");
        // The server is gone: the probe fails rather than hangs.
        assert!(fails_soon(&https).await);
    }

    /// A grpc.health.v1 server answering each call with the next status of `statuses`, checking
    /// the request names `service`.
    async fn health_server(
        listener: tokio::net::TcpListener,
        service: &'static str,
        statuses: Vec<u64>,
    ) {
        for status in statuses {
            let (s, _) = listener.accept().await.unwrap();
            let mut conn = h2::server::handshake(s).await.unwrap();
            let (request, mut respond) = conn.accept().await.unwrap().unwrap();
            tokio::spawn(async move { while conn.accept().await.is_some() {} });
            assert_eq!(request.uri().path(), "/grpc.health.v1.Health/Check");
            let mut body = request.into_body();
            let mut data = Vec::new();
            while let Some(chunk) = body.data().await {
                data.extend_from_slice(&chunk.unwrap());
            }
            assert_eq!(&data[5..], health_check_request(service).as_slice());
            let response = http::Response::builder()
                .status(200)
                .header("content-type", "application/grpc")
                .body(())
                .unwrap();
            let mut send = respond.send_response(response, false).unwrap();
            send.send_data(grpc_frame(&[0x08, status as u8]), false)
                .unwrap();
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", "0".parse().unwrap());
            send.send_trailers(trailers).unwrap();
        }
    }

    #[tokio::test]
    async fn grpc_probe_passes_on_serving_only() {
        let ip = own_ip(1);
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // SERVING, then NOT_SERVING (2).
        let server = tokio::spawn(health_server(listener, "data", vec![SERVING, 2]));
        let grpc = ProbeAction::Grpc {
            ip,
            port,
            service: "data".into(),
        };
        assert!(run(&grpc, Duration::from_secs(5)).await);
        assert!(!run(&grpc, Duration::from_secs(5)).await);
        server.await.unwrap();
        // Nothing listens any more.
        assert!(fails_soon(&grpc).await);
    }

    #[test]
    fn health_responses_decode_and_malformed_ones_do_not() {
        assert_eq!(health_status(&grpc_frame(&[0x08, 1])), Some(1));
        assert_eq!(health_status(&grpc_frame(&[])), Some(0));
        assert_eq!(health_status(&[0, 0, 0, 0, 9, 0x08]), None);
        assert_eq!(health_status(&grpc_frame(&[0x12, 1])), None);
    }
}
