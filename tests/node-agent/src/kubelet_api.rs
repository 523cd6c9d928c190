//! The part of the kubelet's API the apiserver proxies `kubectl logs` to: HTTPS on the node's
//! address, clients authenticated by a certificate of the cluster CA and allowed only as the
//! apiserver's kubelet client (or system:masters), `GET /containerLogs/{ns}/{pod}/{container}`
//! with `follow`, `tailLines` and `limitBytes`, and `/healthz`.
//!
//! Responses are HTTP/1.1 with `Connection: close` and a body that ends with the connection, which
//! also serves a followed log without chunking.

use std::collections::HashSet;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls_pki_types::CertificateDer;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The containers running on this node, as `namespace/pod/container`: a followed log ends when
/// its container is no longer among them.
#[derive(Debug, Clone, Default)]
pub struct Running(Arc<Mutex<HashSet<String>>>);

impl Running {
    fn key(ns: &str, pod: &str, container: &str) -> String {
        format!("{ns}/{pod}/{container}")
    }

    pub fn insert(&self, ns: &str, pod: &str, container: &str) {
        self.lock().insert(Self::key(ns, pod, container));
    }

    pub fn remove(&self, ns: &str, pod: &str, container: &str) {
        self.lock().remove(&Self::key(ns, pod, container));
    }

    fn contains(&self, ns: &str, pod: &str, container: &str) -> bool {
        self.lock().contains(&Self::key(ns, pod, container))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The client identities allowed in: the apiserver's kubelet client, and cluster admins.
const ALLOWED_CN: &str = "kube-apiserver-kubelet-client";
const ALLOWED_O: &str = "system:masters";
/// The request head may be at most this long.
const MAX_HEAD: usize = 16 * 1024;
const FOLLOW_POLL: Duration = Duration::from_millis(200);

/// A TLS configuration that requires a client certificate of `ca`.
pub fn server_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    ca_pem: &[u8],
) -> anyhow::Result<rustls::ServerConfig> {
    use rustls_pki_types::pem::PemObject as _;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert?)?;
    }
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider.clone())
            .build()?;
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert_pem).collect::<Result<_, _>>()?;
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key_pem)?;
    Ok(rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)?)
}

/// Serves until the listener fails; each connection in a task of its own.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    logs_dir: PathBuf,
    running: Running,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let acceptor = acceptor.clone();
        let logs_dir = logs_dir.clone();
        let running = running.clone();
        tokio::spawn(async move {
            let Ok(Ok(tls)) =
                tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await
            else {
                return;
            };
            let _ = handle(tls, &logs_dir, &running).await;
        });
    }
}

async fn handle(
    mut tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    logs_dir: &std::path::Path,
    running: &Running,
) -> std::io::Result<()> {
    let allowed = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .is_some_and(|c| identity_allowed(c));
    let Some(head) = read_head(&mut tls).await? else {
        return respond(&mut tls, 400, "malformed request\n").await;
    };
    if !allowed {
        return respond(
            &mut tls,
            403,
            "forbidden: not the apiserver's kubelet client\n",
        )
        .await;
    }
    let request = match parse_request(&head) {
        Ok(r) => r,
        Err((code, msg)) => return respond(&mut tls, code, &msg).await,
    };
    match request {
        Request::Healthz => respond(&mut tls, 200, "ok").await,
        Request::Logs(q) => serve_log(&mut tls, logs_dir, running, &q).await,
    }
}

fn identity_allowed(cert: &CertificateDer<'_>) -> bool {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return false;
    };
    let subject = cert.subject();
    subject
        .iter_common_name()
        .any(|cn| cn.as_str() == Ok(ALLOWED_CN))
        || subject
            .iter_organization()
            .any(|o| o.as_str() == Ok(ALLOWED_O))
}

async fn read_head<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> std::io::Result<Option<String>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut chunk))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            buf.truncate(end);
            return Ok(String::from_utf8(buf).ok());
        }
        if buf.len() > MAX_HEAD {
            return Ok(None);
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Request {
    Healthz,
    Logs(LogQuery),
}

#[derive(Debug, PartialEq, Eq)]
struct LogQuery {
    namespace: String,
    pod: String,
    container: String,
    follow: bool,
    tail_lines: Option<u64>,
    limit_bytes: Option<u64>,
}

/// Names as the apiserver allows them: DNS labels and subdomains, so no `/`, `..` or NUL.
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !s.starts_with('.')
        && !s.contains("..")
}

fn parse_request(head: &str) -> Result<Request, (u16, String)> {
    let line = head.lines().next().unwrap_or_default();
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Err((400, "malformed request line\n".into()));
    };
    if method != "GET" {
        return Err((405, "only GET\n".into()));
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    if path == "/healthz" {
        return Ok(Request::Healthz);
    }
    let Some(rest) = path.strip_prefix("/containerLogs/") else {
        return Err((404, "not found\n".into()));
    };
    let names: Vec<&str> = rest.split('/').collect();
    let [namespace, pod, container] = names[..] else {
        return Err((404, "not found\n".into()));
    };
    if ![namespace, pod, container].iter().all(|n| valid_name(n)) {
        return Err((400, "invalid namespace, pod or container name\n".into()));
    }
    let mut q = LogQuery {
        namespace: namespace.into(),
        pod: pod.into(),
        container: container.into(),
        follow: false,
        tail_lines: None,
        limit_bytes: None,
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let number = || {
            v.parse::<u64>()
                .map_err(|_| (400, format!("{k} must be a number\n")))
        };
        match k {
            "follow" => q.follow = v == "true" || v == "1",
            "tailLines" => q.tail_lines = Some(number()?),
            "limitBytes" => q.limit_bytes = Some(number()?),
            "previous" if v == "true" => {
                return Err((
                    400,
                    "previous container logs are not kept on this node\n".into(),
                ));
            }
            _ => {}
        }
    }
    Ok(Request::Logs(q))
}

async fn respond<S: tokio::io::AsyncWrite + Unpin>(
    s: &mut S,
    code: u16,
    body: &str,
) -> std::io::Result<()> {
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        _ => "Error",
    };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    s.write_all(body.as_bytes()).await?;
    s.shutdown().await
}

/// Where the last `lines` lines of the file start, reading backwards in bounded chunks.
fn tail_offset(file: &mut std::fs::File, lines: u64) -> std::io::Result<u64> {
    let len = file.metadata()?.len();
    if lines == 0 {
        return Ok(len);
    }
    let mut pos = len;
    let mut seen = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    // A final newline ends the last line rather than starting an empty one.
    let mut skip_last = true;
    while pos > 0 {
        let step = (buf.len() as u64).min(pos);
        pos -= step;
        file.seek(SeekFrom::Start(pos))?;
        let chunk = &mut buf[..step as usize];
        file.read_exact(chunk)?;
        for (i, b) in chunk.iter().enumerate().rev() {
            if *b != b'\n' {
                skip_last = false;
                continue;
            }
            if skip_last && pos + i as u64 == len - 1 {
                continue;
            }
            seen += 1;
            if seen == lines {
                return Ok(pos + i as u64 + 1);
            }
        }
    }
    Ok(0)
}

async fn serve_log<S: tokio::io::AsyncWrite + Unpin>(
    s: &mut S,
    logs_dir: &std::path::Path,
    running: &Running,
    q: &LogQuery,
) -> std::io::Result<()> {
    let path = logs_dir.join(format!("{}_{}_{}.log", q.namespace, q.pod, q.container));
    let Ok(mut file) = std::fs::File::open(&path) else {
        let msg = format!(
            "container {:?} in pod {:?} has no log on this node\n",
            q.container, q.pod
        );
        return respond(s, 404, &msg).await;
    };
    let start = match q.tail_lines {
        Some(n) => tail_offset(&mut file, n)?,
        None => 0,
    };
    file.seek(SeekFrom::Start(start))?;
    s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
        .await?;
    let mut budget = q.limit_bytes.unwrap_or(u64::MAX);
    let mut buf = vec![0u8; 64 * 1024];
    let mut draining = false;
    loop {
        let n = file.read(&mut buf)?;
        if n > 0 {
            let take = (n as u64).min(budget) as usize;
            s.write_all(&buf[..take]).await?;
            budget -= take as u64;
            if budget == 0 {
                break;
            }
            continue;
        }
        // At the end: done, unless following a container that still runs. Once it stopped, one
        // more pass picks up what it wrote before it did.
        if !q.follow || draining {
            break;
        }
        if !running.contains(&q.namespace, &q.pod, &q.container) {
            draining = true;
            continue;
        }
        s.flush().await?;
        tokio::time::sleep(FOLLOW_POLL).await;
    }
    s.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_hostile_names_are_refused() {
        let q = parse_request(
            "GET /containerLogs/demo/web-1/main?follow=true&tailLines=5&limitBytes=9 HTTP/1.1\r\nHost: x",
        )
        .unwrap();
        assert_eq!(
            q,
            Request::Logs(LogQuery {
                namespace: "demo".into(),
                pod: "web-1".into(),
                container: "main".into(),
                follow: true,
                tail_lines: Some(5),
                limit_bytes: Some(9),
            })
        );
        assert_eq!(
            parse_request("GET /healthz HTTP/1.1").unwrap(),
            Request::Healthz
        );
        for bad in [
            "GET /containerLogs/../etc/passwd HTTP/1.1",
            "GET /containerLogs/a/..%2f/c HTTP/1.1",
            "GET /containerLogs/a/../c HTTP/1.1",
            "GET /containerLogs/a/b_c/d HTTP/1.1",
        ] {
            assert_eq!(parse_request(bad).unwrap_err().0, 400, "{bad}");
        }
        assert_eq!(
            parse_request("GET /containerLogs/a/b HTTP/1.1")
                .unwrap_err()
                .0,
            404
        );
        assert_eq!(parse_request("POST /healthz HTTP/1.1").unwrap_err().0, 405);
        assert_eq!(
            parse_request("GET /containerLogs/a/b/c?tailLines=x HTTP/1.1")
                .unwrap_err()
                .0,
            400
        );
    }

    #[test]
    fn tail_offset_finds_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, "one\ntwo\nthree\n").unwrap();
        let mut f = std::fs::File::open(&path).unwrap();
        let text = |off: u64| std::fs::read_to_string(&path).unwrap()[off as usize..].to_string();
        assert_eq!(text(tail_offset(&mut f, 1).unwrap()), "three\n");
        assert_eq!(text(tail_offset(&mut f, 2).unwrap()), "two\nthree\n");
        assert_eq!(text(tail_offset(&mut f, 9).unwrap()), "one\ntwo\nthree\n");
        assert_eq!(text(tail_offset(&mut f, 0).unwrap()), "");
        std::fs::write(&path, "a\nno newline at the end").unwrap();
        let mut f = std::fs::File::open(&path).unwrap();
        assert_eq!(
            text(tail_offset(&mut f, 1).unwrap()),
            "no newline at the end"
        );
    }

    struct Pki {
        ca_pem: String,
        server: (String, String),
        client: (String, String),
        stranger: (String, String),
    }

    fn pki() -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "test-ca");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let leaf = |cn: &str, signer: &rcgen::Issuer<'_, KeyPair>| {
            let key = KeyPair::generate().unwrap();
            let mut p = CertificateParams::new(vec!["127.0.0.1".into()]).unwrap();
            p.distinguished_name.push(DnType::CommonName, cn);
            let cert = p.signed_by(&key, signer).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        // A certificate of another CA, with the right name.
        let other_key = KeyPair::generate().unwrap();
        let mut other = CertificateParams::new(Vec::<String>::new()).unwrap();
        other.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let other = rcgen::Issuer::new(other, other_key);
        Pki {
            ca_pem: ca_cert.pem(),
            server: leaf("node-a", &issuer),
            client: leaf(ALLOWED_CN, &issuer),
            stranger: leaf(ALLOWED_CN, &other),
        }
    }

    async fn get(
        pki: &Pki,
        client: Option<&(String, String)>,
        addr: std::net::SocketAddr,
        path: &str,
        on_connected: impl FnOnce(),
    ) -> Result<String, String> {
        use rustls_pki_types::pem::PemObject as _;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(pki.ca_pem.as_bytes()).unwrap())
            .unwrap();
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = match client {
            Some((cert, key)) => builder
                .with_client_auth_cert(
                    vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
                    rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
                )
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect("127.0.0.1".try_into().unwrap(), tcp)
            .await
            .map_err(|e| e.to_string())?;
        tls.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut first = [0u8; 12];
        tls.read_exact(&mut first)
            .await
            .map_err(|e| e.to_string())?;
        on_connected();
        let mut rest = String::new();
        tls.read_to_string(&mut rest)
            .await
            .map_err(|e| e.to_string())?;
        Ok(format!("{}{rest}", String::from_utf8_lossy(&first)))
    }

    #[tokio::test]
    async fn logs_are_served_to_the_apiservers_client_only() {
        let pki = pki();
        let logs = tempfile::tempdir().unwrap();
        let log = logs.path().join("demo_web_main.log");
        std::fs::write(&log, "one\ntwo\nthree\n").unwrap();
        let tls = server_config(
            pki.server.0.as_bytes(),
            pki.server.1.as_bytes(),
            pki.ca_pem.as_bytes(),
        )
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let running = Running::default();
        running.insert("demo", "web", "main");
        let server = tokio::spawn(serve(
            listener,
            Arc::new(tls),
            logs.path().to_path_buf(),
            running.clone(),
        ));
        let body = |r: &str| r.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();

        let whole = get(
            &pki,
            Some(&pki.client),
            addr,
            "/containerLogs/demo/web/main",
            || {},
        )
        .await;
        assert_eq!(body(&whole.unwrap()), "one\ntwo\nthree\n");
        let tail = get(
            &pki,
            Some(&pki.client),
            addr,
            "/containerLogs/demo/web/main?tailLines=1",
            || {},
        )
        .await
        .unwrap();
        assert_eq!(body(&tail), "three\n");
        let limited = get(
            &pki,
            Some(&pki.client),
            addr,
            "/containerLogs/demo/web/main?limitBytes=5",
            || {},
        )
        .await
        .unwrap();
        assert_eq!(body(&limited), "one\nt");
        let missing = get(
            &pki,
            Some(&pki.client),
            addr,
            "/containerLogs/demo/web/other",
            || {},
        )
        .await
        .unwrap();
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");

        // Following: a line appended after the request arrives; the stream ends once the
        // container is no longer running.
        let followed = get(
            &pki,
            Some(&pki.client),
            addr,
            "/containerLogs/demo/web/main?follow=true&tailLines=0",
            || {
                use std::io::Write as _;
                let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
                f.write_all(b"four\n").unwrap();
                running.remove("demo", "web", "main");
            },
        )
        .await
        .unwrap();
        assert_eq!(body(&followed), "four\n");

        // Refused: no client certificate, or one of another CA (at the handshake); a certificate
        // of the CA with another name (403).
        assert!(get(&pki, None, addr, "/healthz", || {}).await.is_err());
        assert!(
            get(&pki, Some(&pki.stranger), addr, "/healthz", || {})
                .await
                .is_err()
        );
        let node_cert = get(
            &pki,
            Some(&pki.server),
            addr,
            "/containerLogs/demo/web/main",
            || {},
        )
        .await
        .unwrap();
        assert!(node_cert.starts_with("HTTP/1.1 403"), "{node_cert}");
        server.abort();
    }
}
