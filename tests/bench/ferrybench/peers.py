"""The network peers' servers, all on loopback and all inside the benchmark's mount namespace so their
writes land on the work directory's filesystem: an sshd with throwaway host and user keys (for
`rsync -a` over ssh and `scp -r`), and VolSync's rsync-TLS design: an `rsync --daemon` spawned per
connection by a PSK `stunnel` server, reached through a `stunnel` client on the sending side.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import proc

CIPHER = "aes128-gcm@openssh.com"
SSH_HOST = "ferry-bench"


@dataclass
class Ssh:
    config: Path     # ssh_config for `ssh -F`; defines host ferry-bench
    port: int

    def ssh_cmd(self) -> str:
        """The `-e` value for rsync."""
        return f"ssh -F {self.config}"


def start_sshd(workdir: Path, daemons: proc.Daemons) -> Ssh:
    d = workdir / "ssh"
    d.mkdir(parents=True, exist_ok=True)
    host_key, user_key = d / "host_ed25519", d / "user_ed25519"
    for key in (host_key, user_key):
        if not key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ferry-bench", "-f", str(key)],
                           check=True)
    (d / "authorized_keys").write_text(Path(f"{user_key}.pub").read_text())
    port = proc.free_port()
    sshd_config = d / "sshd_config"
    sshd_config.write_text(
        f"""Port {port}
ListenAddress 127.0.0.1
HostKey {host_key}
PidFile {d}/sshd.pid
AuthorizedKeysFile {d}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
Ciphers {CIPHER}
Compression no
MaxStartups 50
MaxSessions 50
LogLevel ERROR
Subsystem sftp /usr/lib/openssh/sftp-server
"""
    )
    ssh_config = d / "ssh_config"
    ssh_config.write_text(
        f"""Host {SSH_HOST}
  HostName 127.0.0.1
  Port {port}
  User {pwd.getpwuid(os.geteuid()).pw_name}
  IdentityFile {user_key}
  IdentitiesOnly yes
  Ciphers {CIPHER}
  Compression no
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  BatchMode yes
  LogLevel ERROR
"""
    )
    # sshd insists on its privilege-separation directory.
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    p = daemons.spawn("sshd", ["/usr/sbin/sshd", "-D", "-e", "-f", str(sshd_config)], d / "sshd.log")
    proc.wait_listening(port, p, "sshd")
    check = subprocess.run(["ssh", "-F", str(ssh_config), SSH_HOST, "true"], capture_output=True, text=True,
                           timeout=30)
    if check.returncode != 0:
        raise proc.ProcError(f"ssh to the benchmark sshd on port {port} failed: {check.stderr.strip()}")
    return Ssh(ssh_config, port)


@dataclass
class RsyncTls:
    client_port: int   # the stunnel client's loopback port the rsync client connects to
    module: str
    module_dir: Path   # the rsync module's path; runs write into subdirectories of it

    def url(self, name: str) -> str:
        return f"rsync://127.0.0.1:{self.client_port}/{self.module}/{name}/"


def start_rsync_tls(workdir: Path, module_dir: Path, daemons: proc.Daemons) -> RsyncTls:
    """stunnel server (PSK, `exec` rsync --server --daemon per connection, as VolSync's destination
    mover does) and a stunnel client (as VolSync's source mover does)."""
    d = workdir / "stunnel"
    d.mkdir(parents=True, exist_ok=True)
    module_dir.mkdir(parents=True, exist_ok=True)
    psk = d / "psk.txt"
    psk.write_text("volsync:" + hashlib.sha256(b"ferry-bench-psk").hexdigest() + "\n")
    psk.chmod(0o600)
    rsyncd = d / "rsyncd.conf"
    rsyncd.write_text(
        f"""use chroot = false
numeric ids = true
munge symlinks = false
reverse lookup = false
read only = false
uid = 0
gid = 0
log file = {d}/rsyncd.log

[data]
path = {module_dir}
"""
    )
    server_port, client_port = proc.free_port(), proc.free_port()
    while client_port == server_port:
        client_port = proc.free_port()
    server_conf = d / "server.conf"
    server_conf.write_text(
        f"""foreground = yes
pid =
syslog = no
debug = 3
output = {d}/server.log

[rsync]
ciphers = PSK
PSKsecrets = {psk}
accept = 127.0.0.1:{server_port}
client = no
exec = /usr/bin/rsync
execargs = rsync --server --daemon --config={rsyncd} .
"""
    )
    client_conf = d / "client.conf"
    client_conf.write_text(
        f"""foreground = yes
pid =
syslog = no
debug = 3
output = {d}/client.log

[rsync]
ciphers = PSK
PSKsecrets = {psk}
accept = 127.0.0.1:{client_port}
client = yes
connect = 127.0.0.1:{server_port}
"""
    )
    p = daemons.spawn("stunnel server", ["stunnel", str(server_conf)], d / "server.stdout")
    proc.wait_listening(server_port, p, "stunnel server")
    p = daemons.spawn("stunnel client", ["stunnel", str(client_conf)], d / "client.stdout")
    proc.wait_listening(client_port, p, "stunnel client")
    tls = RsyncTls(client_port, "data", module_dir)
    probe = module_dir / ".probe"
    check = subprocess.run(["rsync", "-a", f"{rsyncd}", tls.url(".probe")], capture_output=True, text=True,
                           timeout=30)
    if check.returncode != 0 or not (probe / "rsyncd.conf").exists():
        raise proc.ProcError(f"rsync through stunnel (port {client_port}) failed: {check.stderr.strip()}")
    subprocess.run(["rm", "-rf", "--", str(probe)], check=False)
    return tls
