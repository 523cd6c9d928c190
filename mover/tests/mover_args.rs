//! The command line the operator renders for a mover pod (`ferry_proto::mover_args`) parses
//! back, option for option, with the mover's own clap command line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use clap::{Parser, ValueEnum};
use ferry_mover::cli::{Cli, Command};
use ferry_proto::mover_args::{
    CommonArgs, MoverArgs, PeerArgs, ReceiveArgs, RoleArgs, SendArgs, SwarmArgs,
};

/// Every option set, none at its default.
fn common() -> CommonArgs {
    CommonArgs {
        root: "/data".into(),
        sub_path: Some("team/set".into()),
        transfer: "uid.3".into(),
        peer: Some(PeerArgs {
            ca: "/tls/peer-ca.crt".into(),
            cluster: "west".into(),
        }),
        ca: "/tls/ca.crt".into(),
        cert: "/tls/tls.crt".into(),
        key: "/tls/tls.key".into(),
        progress_listen: "$(POD_IP):7401".into(),
        progress_linger: 30,
        json: true,
        log_level: Some("info".into()),
        sync: true,
    }
}

/// What the kubelet does to `$(POD_IP)`, then the mover's parser.
fn parse(args: &MoverArgs) -> Cli {
    let words = args
        .to_args()
        .into_iter()
        .map(|w| w.replace("$(POD_IP)", "10.1.2.3"));
    Cli::try_parse_from(std::iter::once("ferry-mover".to_owned()).chain(words))
        .unwrap_or_else(|e| panic!("{:?} does not parse: {e}", args.to_args()))
}

fn check_common(cli: &Cli, tls: &ferry_mover::cli::net::TlsArgs, c: &CommonArgs) {
    let peer = c.peer.as_ref().unwrap();
    assert_eq!(tls.transfer.as_deref(), Some(c.transfer.as_str()));
    assert_eq!(
        tls.peer_ca.as_ref().unwrap().to_str(),
        Some(peer.ca.as_str())
    );
    assert_eq!(tls.peer_cluster.as_deref(), Some(peer.cluster.as_str()));
    assert_eq!(tls.ca.to_str(), Some(c.ca.as_str()));
    assert_eq!(tls.cert.to_str(), Some(c.cert.as_str()));
    assert_eq!(tls.key.to_str(), Some(c.key.as_str()));
    assert_eq!(
        tls.progress_listen.unwrap().to_string(),
        c.progress_listen.replace("$(POD_IP)", "10.1.2.3")
    );
    assert_eq!(tls.progress_linger, c.progress_linger);
    assert_eq!(tls.json, c.json);
    assert_eq!(tls.sync, c.sync);
    assert_eq!(cli.log_level, c.log_level);
}

#[test]
fn every_receiver_option_the_operator_renders_parses_back() {
    let r = ReceiveArgs {
        listen: "$(POD_IP):7400".into(),
        once: true,
        owner: true,
        special_bits: true,
        block_service: Some("10.0.0.9:7443".into()),
        swarm: Some(SwarmArgs {
            peers: vec![
                "10.0.0.9:7443".into(),
                String::new(),
                "10.0.0.7:7443".into(),
            ],
            me: 2,
            complete: vec![0],
        }),
    };
    let args = MoverArgs {
        role: RoleArgs::Receive(r.clone()),
        common: common(),
    };
    let cli = parse(&args);
    let Command::Receive(got) = &cli.command else {
        panic!("not receive: {:?}", cli.command);
    };
    assert_eq!(got.listen, "10.1.2.3:7400");
    assert_eq!(got.once, r.once);
    assert_eq!(got.owner, r.owner);
    assert_eq!(got.special_bits, r.special_bits);
    assert_eq!(got.block_service, r.block_service);
    let swarm = r.swarm.as_ref().unwrap();
    assert_eq!(got.swarm_peers, swarm.peers);
    assert_eq!(got.swarm_self, Some(swarm.me));
    assert_eq!(got.swarm_complete, swarm.complete);
    assert_eq!(got.root.to_str(), Some("/data"));
    assert_eq!(got.sub_path.as_deref(), Some("team/set"));
    check_common(&cli, &got.tls, &args.common);
}

#[test]
fn every_sender_option_the_operator_renders_parses_back() {
    let s = SendArgs {
        connect: vec![
            "uid-a.1@10.0.0.5:7400".into(),
            "uid-b.1@10.0.0.6:7400".into(),
        ],
        connect_retry: 30,
        streams: 8,
        compress: "lz4".into(),
        delete: true,
        checksum: true,
        skip_unreadable: true,
        exclude: vec!["-starts-with-a-dash".into(), "*.tmp".into()],
        bandwidth_limit: Some(50_000_000),
    };
    let args = MoverArgs {
        role: RoleArgs::Send(s.clone()),
        common: common(),
    };
    let cli = parse(&args);
    let Command::Send(got) = &cli.command else {
        panic!("not send: {:?}", cli.command);
    };
    assert_eq!(got.connect, s.connect);
    assert_eq!(got.connect_retry, s.connect_retry);
    assert_eq!(got.streams, s.streams);
    assert_eq!(
        got.compress.to_possible_value().unwrap().get_name(),
        s.compress
    );
    assert_eq!(got.delete, s.delete);
    assert_eq!(got.checksum, s.checksum);
    assert_eq!(got.skip_unreadable, s.skip_unreadable);
    assert_eq!(got.filter.exclude, s.exclude);
    assert_eq!(got.bandwidth_limit, s.bandwidth_limit);
    assert_eq!(got.root.to_str(), Some("/data"));
    assert_eq!(got.sub_path.as_deref(), Some("team/set"));
    check_common(&cli, &got.tls, &args.common);
}

#[test]
fn options_left_unset_render_nothing_the_mover_would_read_as_set() {
    let args = MoverArgs {
        role: RoleArgs::Receive(ReceiveArgs {
            listen: "$(POD_IP):7400".into(),
            ..ReceiveArgs::default()
        }),
        common: CommonArgs {
            root: "/data".into(),
            transfer: "uid.1".into(),
            ca: "/tls/ca.crt".into(),
            cert: "/tls/tls.crt".into(),
            key: "/tls/tls.key".into(),
            progress_listen: "$(POD_IP):7401".into(),
            ..CommonArgs::default()
        },
    };
    let cli = parse(&args);
    let Command::Receive(got) = &cli.command else {
        panic!("not receive");
    };
    assert!(!got.once && !got.owner && !got.special_bits && !got.tls.json && !got.tls.sync);
    assert!(got.block_service.is_none() && got.swarm_peers.is_empty());
    assert!(got.sub_path.is_none() && got.tls.peer_ca.is_none());
    assert_eq!(cli.log_level, None);
}
