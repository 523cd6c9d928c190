//! `ferry-cluster-probe`: the small program the cluster tests run in pods (image `.../ferry-cluster-probe`).
//! Each subcommand prints what it saw to stdout, which lands in the container's log file.

use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::ListParams;
use kube::{Api, Client};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "probe/mallory.rs"]
mod mallory;

#[derive(Debug, Parser)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Answers every TCP connection (and so every HTTP GET) on $POD_IP:PORT with "hello from $POD_NAME".
    Serve {
        #[arg(long)]
        port: u16,
    },
    /// Connects to ADDR (retrying for up to 60 s), prints the reply, fails unless it contains EXPECT.
    Connect {
        #[arg(long)]
        addr: String,
        #[arg(long)]
        expect: String,
    },
    /// Prints its pid (in its PID namespace), then waits for SIGTERM (reports it and exits 0) or
    /// ignores it with --ignore-term.
    Sleep {
        #[arg(long)]
        ignore_term: bool,
        /// Also appends each line to FILE (on a volume), which outlives the pod and its log.
        #[arg(long)]
        record: Option<std::path::PathBuf>,
    },
    /// Serves grpc.health.v1.Health/Check over h2c on $POD_IP:PORT: SERVING while FILE exists,
    /// NOT_SERVING otherwise.
    GrpcHealth {
        #[arg(long)]
        port: u16,
        #[arg(long)]
        serving_while_file: std::path::PathBuf,
    },
    /// Uses the pod's service account from inside the cluster: lists pods here (allowed by the test's
    /// Role), pods in kube-system and secrets here (both beyond it), prints one JSON line, then sleeps.
    Rbac,
    /// Exits 0 when PATH exists, 1 otherwise: an exec probe for an image without a shell.
    Exists { path: std::path::PathBuf },
    /// A hostile tenant against the node service at SERVICE, with the receiver certificate in
    /// CERTS (`ca.crt`, `receiver.crt`, `receiver.key`) of Transfer TRANSFER_ID: stalled Takes,
    /// held partial Puts and timed probes for SECONDS; prints one JSON line.
    Mallory {
        #[arg(long)]
        service: std::net::SocketAddr,
        #[arg(long)]
        certs: std::path::PathBuf,
        #[arg(long)]
        transfer_id: String,
        #[arg(long)]
        seconds: u64,
        /// Hashes (hex, comma-separated) of blocks another tenant stored.
        #[arg(long, value_delimiter = ',')]
        present: Vec<String>,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Args::parse().command {
        Command::Serve { port } => serve(port).await,
        Command::Connect { addr, expect } => connect(&addr, &expect).await,
        Command::Sleep {
            ignore_term,
            record,
        } => sleep(ignore_term, record).await,
        Command::GrpcHealth {
            port,
            serving_while_file,
        } => grpc_health(port, serving_while_file).await,
        Command::Rbac => rbac().await,
        Command::Mallory {
            service,
            certs,
            transfer_id,
            seconds,
            present,
        } => {
            mallory::run(mallory::Plan {
                service,
                certs,
                transfer_id,
                seconds,
                present,
            })
            .await
        }
        Command::Exists { path } => {
            if !path.exists() {
                std::process::exit(1);
            }
            Ok(())
        }
    }
}

async fn serve(port: u16) -> anyhow::Result<()> {
    let ip = std::env::var("POD_IP").context("POD_IP is not set")?;
    let name = std::env::var("POD_NAME").unwrap_or_else(|_| "unknown".into());
    let listener = tokio::net::TcpListener::bind((ip.as_str(), port))
        .await
        .with_context(|| format!("failed to listen on {ip}:{port}"))?;
    println!("listening on {ip}:{port}");
    loop {
        let (mut stream, peer) = listener.accept().await.context("accept failed")?;
        let body = format!("hello from {name}\n");
        println!("connection from {peer}");
        tokio::spawn(async move {
            // Read whatever request came (an HTTP probe sends one), then answer in HTTP form, which a
            // raw TCP reader sees as text too.
            let mut buf = [0u8; 1024];
            let _ = tokio::time::timeout(Duration::from_millis(200), stream.read(&mut buf)).await;
            let reply = format!(
                "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(reply.as_bytes()).await;
        });
    }
}

async fn grpc_health(port: u16, flag: std::path::PathBuf) -> anyhow::Result<()> {
    let ip = std::env::var("POD_IP").context("POD_IP is not set")?;
    let listener = tokio::net::TcpListener::bind((ip.as_str(), port))
        .await
        .with_context(|| format!("failed to listen on {ip}:{port}"))?;
    println!("grpc health on {ip}:{port}");
    loop {
        let (stream, _) = listener.accept().await.context("accept failed")?;
        let flag = flag.clone();
        tokio::spawn(async move {
            let Ok(mut conn) = h2::server::handshake(stream).await else {
                return;
            };
            while let Some(Ok((request, mut respond))) = conn.accept().await {
                // The request body (one HealthCheckRequest) is not needed to answer.
                drop(request);
                let serving = flag.exists();
                let Ok(response) = http::Response::builder()
                    .status(200)
                    .header("content-type", "application/grpc")
                    .body(())
                else {
                    continue;
                };
                let Ok(mut send) = respond.send_response(response, false) else {
                    continue;
                };
                // HealthCheckResponse { status: SERVING (1) | NOT_SERVING (2) }, one gRPC frame.
                let status: u8 = if serving { 1 } else { 2 };
                let frame = bytes::Bytes::from(vec![0, 0, 0, 0, 2, 0x08, status]);
                let _ = send.send_data(frame, false);
                let mut trailers = http::HeaderMap::new();
                trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                let _ = send.send_trailers(trailers);
            }
        });
    }
}

async fn connect(addr: &str, expect: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(mut stream) => {
                stream.write_all(b"GET / HTTP/1.0\r\n\r\n").await?;
                let mut reply = String::new();
                stream.read_to_string(&mut reply).await?;
                println!("reply from {addr}: {reply:?}");
                anyhow::ensure!(reply.contains(expect), "reply from {addr} lacks {expect:?}");
                return Ok(());
            }
            Err(e) if tokio::time::Instant::now() < deadline => {
                println!("connect {addr}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e).with_context(|| format!("failed to connect to {addr}")),
        }
    }
}

async fn sleep(ignore_term: bool, record: Option<std::path::PathBuf>) -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let say = |line: &str| -> anyhow::Result<()> {
        println!("{line}");
        if let Some(path) = &record {
            use std::io::Write as _;
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("failed to open {}", path.display()))?;
            writeln!(file, "{line}")?;
        }
        Ok(())
    };
    say(&format!("pid {}", std::process::id()))?;
    loop {
        term.recv().await;
        say("received SIGTERM")?;
        if !ignore_term {
            return Ok(());
        }
    }
}

/// "allowed <n> [names]" or "forbidden <code>".
fn outcome<T>(
    result: Result<kube::core::ObjectList<T>, kube::Error>,
    name: impl Fn(&T) -> String,
) -> String
where
    T: Clone,
{
    match result {
        Ok(list) => format!(
            "allowed {} [{}]",
            list.items.len(),
            list.items.iter().map(name).collect::<Vec<_>>().join(",")
        ),
        Err(kube::Error::Api(e)) => format!("forbidden {}", e.code),
        Err(e) => format!("error {e}"),
    }
}

async fn rbac() -> anyhow::Result<()> {
    let config = kube::Config::incluster().context("failed to load the in-cluster config")?;
    let namespace = config.default_namespace.clone();
    let client = Client::try_from(config).context("failed to build the in-cluster client")?;
    let here: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let system: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let secrets: Api<Secret> = Api::namespaced(client, &namespace);
    let lp = ListParams::default();
    let pod_name = |p: &Pod| p.metadata.name.clone().unwrap_or_default();
    let report = serde_json::json!({
        "namespace": namespace,
        "own_namespace_pods": outcome(here.list(&lp).await, pod_name),
        "kube_system_pods": outcome(system.list(&lp).await, pod_name),
        "own_namespace_secrets": outcome(secrets.list(&lp).await, |s: &Secret| s.metadata.name.clone().unwrap_or_default()),
    });
    println!("rbac {report}");
    loop {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
}
