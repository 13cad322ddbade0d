//! The cluster's credentials: one secret, two roles.
//!
//! - The **cluster secret** (`security.secret_file`, 32 random bytes in hex, mode 0600) is
//!   what the services hold: the master and the workers. It authenticates a worker to the
//!   master (registration, heartbeats, block commits, and `GetMount`, which returns a
//!   mount's UFS credentials) and services to each other's data paths.
//! - The **client token** (`security.token_file`) is derived from it,
//!   HMAC-SHA256(secret, `"locus client token v1"`), so the services can check it without
//!   storing it. Clients (the CLI, the S3 gateway, the Hadoop connector) present it to
//!   the master and to workers. It grants every namespace and data call, and never the
//!   services' calls: a client cannot read a mount's UFS credentials or pose as a worker.
//!
//! A master that finds no secret file makes one (and the token file beside the
//! configured path); a worker waits for it, so a master and workers started together on
//! one host share it with no set-up. On several hosts, copy `cluster.secret` to each
//! worker and `client.token` to each client host (see README, "Security").
//!
//! Neither value is ever logged: [`Secret`]'s `Debug` and `Display` print a redaction.

use std::fmt;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::config::SecurityConfig;
use crate::{Error, ErrorKind, Result};

/// The label the client token is derived under (a new label makes new tokens).
const CLIENT_TOKEN_LABEL: &[u8] = b"locus client token v1";

/// A credential's text. Compared in constant time; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Secret {
    /// A secret from its text (surrounding whitespace dropped). Refuses one too short
    /// to be a real secret.
    pub fn new(text: &str) -> Result<Secret> {
        let t = text.trim();
        if t.len() < 16 {
            return Err(Error::invalid("a cluster secret or client token must be at least 16 characters"));
        }
        if !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(Error::invalid("a cluster secret or client token must be printable ASCII"));
        }
        Ok(Secret(t.to_string()))
    }

    /// A new random secret (32 bytes from the OS, in hex).
    pub fn generate() -> Secret {
        let bytes: [u8; 32] = rand::random();
        Secret(hex(&bytes))
    }

    /// The text, for the wire (a header or an auth frame). Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this secret, in time independent of where they differ.
    pub fn matches(&self, presented: &str) -> bool {
        same(self.0.as_bytes(), presented.as_bytes())
    }

    /// The client token of this cluster secret.
    pub fn client_token(&self) -> Secret {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(self.0.as_bytes()).expect("HMAC takes any key length");
        mac.update(CLIENT_TOKEN_LABEL);
        Secret(hex(&mac.finalize().into_bytes()))
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Who a caller proved to be. Every request on every port is checked against the roles
/// allowed to send it (the tables in `locus_proto::roles`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// A client: holds the client token.
    Client,
    /// A worker: holds the cluster secret.
    Worker,
    /// The master: holds the cluster secret.
    Master,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Client, Role::Worker, Role::Master];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::Worker => "worker",
            Role::Master => "master",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The label data-path proofs are made under (a new label makes old proofs worthless).
const PROOF_LABEL: &[u8] = b"locus data-path proof v1";
/// The label of the master's write grants.
const GRANT_LABEL: &[u8] = b"locus write grant v1";
/// The label of the master's challenge nonces.
const NONCE_LABEL: &[u8] = b"locus rpc nonce v1";
/// The label of a master group member's proof of itself.
const MEMBER_LABEL: &[u8] = b"locus raft member v1";
/// How long a master RPC challenge's proof is taken.
pub const RPC_NONCE_TTL: std::time::Duration = std::time::Duration::from_secs(600);

/// The label of the master's read tickets.
const TICKET_LABEL: &[u8] = b"locus read ticket v1";

/// Where a block's bytes come from in the UFS: what a read ticket binds to the block id.
#[derive(Clone, Copy, Debug)]
pub struct BlockOrigin<'a> {
    pub block_id: u64,
    pub mount_id: u64,
    pub ufs_path: &'a str,
    /// Where the block starts in the file, and its length.
    pub file_offset: u64,
    pub block_length: u64,
    /// The file's UFS fingerprint the block was cut from.
    pub fingerprint: &'a str,
}

/// HMAC-SHA256 of `parts` under `key`, each part length-prefixed so that no two lists of
/// parts give the same input.
fn mac(key: &Secret, parts: &[&[u8]]) -> [u8; 32] {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key.0.as_bytes()).expect("HMAC takes any key length");
    for p in parts {
        m.update(&(p.len() as u64).to_be_bytes());
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// Whether two byte strings are equal, in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What a caller holds and the role it claims with it. On the data path it answers a
/// listener's challenge with [`Identity::prove`]: an HMAC over the listener's fresh
/// nonce, so a listener that is not a member learns nothing it can use on another
/// connection; the key itself never leaves the process there.
#[derive(Clone, Debug)]
pub struct Identity {
    key: Secret,
    role: Role,
}

impl Identity {
    /// A client holding the client token.
    pub fn client(token: &Secret) -> Identity {
        Identity { key: token.clone(), role: Role::Client }
    }

    /// A member (worker or master) holding the cluster secret.
    pub fn member(secret: &Secret, role: Role) -> Identity {
        debug_assert!(role != Role::Client, "members are workers or the master");
        Identity { key: secret.clone(), role }
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// The proof of this identity for the challenge `nonce`.
    pub fn prove(&self, nonce: &[u8]) -> Vec<u8> {
        mac(&self.key, &[PROOF_LABEL, self.role.as_str().as_bytes(), nonce]).to_vec()
    }

    /// The credential itself, for the master RPC's bearer header (sent only to the
    /// configured master). Never log it.
    pub fn bearer(&self) -> &Secret {
        &self.key
    }
}

/// What the services check callers against: the cluster secret and its client token.
#[derive(Clone, Debug)]
pub struct Verifier {
    secret: Secret,
    client: Secret,
    /// Who makes its nonces, in each nonce's MAC: a nonce is taken only by the port that
    /// made it ([`Verifier::issuing`]), so a proof seen at one master of a group, or at
    /// one of its ports, is worthless at another.
    issuer: [u8; 32],
}

impl Verifier {
    pub fn new(secret: &Secret) -> Verifier {
        Verifier::issuing(secret, "")
    }

    /// A verifier whose nonces only it takes, and its restarts: those of the port named
    /// `port` (unique in the cluster: "rpc <raft address>" for a group's master).
    pub fn issuing(secret: &Secret, port: &str) -> Verifier {
        let issuer = mac(secret, &[NONCE_LABEL, b"issuer", port.as_bytes()]);
        Verifier { secret: secret.clone(), client: secret.client_token(), issuer }
    }

    /// The role a bearer credential (master RPC, web) proves, if any: the client token
    /// is a client's, the cluster secret a worker's (the master never calls itself).
    pub fn role(&self, presented: &str) -> Option<Role> {
        if self.secret.matches(presented) {
            Some(Role::Worker)
        } else if self.client.matches(presented) {
            Some(Role::Client)
        } else {
            None
        }
    }

    /// Whether `proof` answers the challenge `nonce` for `role` (a data-path caller).
    pub fn check(&self, role: Role, nonce: &[u8], proof: &[u8]) -> bool {
        let key = if role == Role::Client { &self.client } else { &self.secret };
        same(&mac(key, &[PROOF_LABEL, role.as_str().as_bytes(), nonce]), proof)
    }

    /// The master's grant to write version `version` of `ufs_path` in mount `mount_id`:
    /// a worker takes a write only with it, so a client writes only what the master
    /// let it create (never a read-only mount, never a path of its choosing).
    pub fn grant(&self, mount_id: u64, ufs_path: &str, version: u64) -> Vec<u8> {
        mac(&self.secret, &[GRANT_LABEL, &mount_id.to_be_bytes(), ufs_path.as_bytes(), &version.to_be_bytes()]).to_vec()
    }

    /// Whether `grant` is the master's grant for this write.
    pub fn check_grant(&self, mount_id: u64, ufs_path: &str, version: u64, grant: &[u8]) -> bool {
        same(&self.grant(mount_id, ufs_path, version), grant)
    }

    /// The master's ticket to fill block `o.block_id` from the UFS: a worker caches bytes
    /// under a block id only from the source the master bound to it, so a client cannot
    /// place another file's bytes (or a range of its choosing) under a block others read.
    pub fn ticket(&self, o: &BlockOrigin) -> Vec<u8> {
        let parts: [&[u8]; 7] = [
            TICKET_LABEL,
            &o.block_id.to_be_bytes(),
            &o.mount_id.to_be_bytes(),
            o.ufs_path.as_bytes(),
            &o.file_offset.to_be_bytes(),
            &o.block_length.to_be_bytes(),
            o.fingerprint.as_bytes(),
        ];
        mac(&self.secret, &parts).to_vec()
    }

    /// Whether `ticket` is the master's ticket for `o`.
    pub fn check_ticket(&self, o: &BlockOrigin, ticket: &[u8]) -> bool {
        same(&self.ticket(o), ticket)
    }

    /// A challenge nonce for the master RPC: the time it was made, 16 random bytes and
    /// a MAC over both, so [`Verifier::fresh`] knows its own nonces without keeping any.
    pub fn nonce(&self) -> Vec<u8> {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
        let r: [u8; 16] = rand::random();
        let mut n = now.to_be_bytes().to_vec();
        n.extend_from_slice(&r);
        let m = mac(&self.secret, &[NONCE_LABEL, &self.issuer, &n]);
        n.extend_from_slice(&m);
        n
    }

    /// Whether `nonce` is one this verifier (or a clone) made, at most [`RPC_NONCE_TTL`]
    /// ago.
    pub fn fresh(&self, nonce: &[u8]) -> bool {
        if nonce.len() != 8 + 16 + 32 {
            return false;
        }
        let (n, m) = nonce.split_at(24);
        let made = u64::from_be_bytes(n[..8].try_into().unwrap_or_default());
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
        same(&mac(&self.secret, &[NONCE_LABEL, &self.issuer, n]), m)
            && made <= now + 5
            && now - made.min(now) < RPC_NONCE_TTL.as_secs()
    }

    /// A master group member's answer to a caller's `nonce`: that the member at
    /// `raft_address` holds the cluster secret. Bound to the address, so a port that
    /// relays the nonce to a real member gets a proof for that member's address only.
    pub fn member_proof(&self, raft_address: &str, nonce: &[u8]) -> Vec<u8> {
        mac(&self.secret, &[MEMBER_LABEL, raft_address.as_bytes(), nonce]).to_vec()
    }

    /// Whether `proof` is [`Verifier::member_proof`] of the member at `raft_address`.
    pub fn check_member(&self, raft_address: &str, nonce: &[u8], proof: &[u8]) -> bool {
        same(&self.member_proof(raft_address, nonce), proof)
    }

    /// This service's identity on the data path, as `role` (worker or master).
    pub fn identity(&self, role: Role) -> Identity {
        Identity::member(&self.secret, role)
    }
}

/// The error a caller without valid credentials gets.
pub fn unauthenticated(what: &str) -> Error {
    Error::new(ErrorKind::Unauthenticated, format!("{what}: missing or wrong cluster credentials"))
}

/// Write `text` to `path` readable by this user only (0600), atomically: a temporary
/// file beside it, renamed into place. Creates the parent directory (0700) if missing.
pub fn write_private(path: &Path, text: &str) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        create_private_dir(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let r = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    r.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(format!("write {}", path.display()), e)
    })
}

/// Create `dir` (and missing parents) with mode 0700 for the directories it makes.
pub fn create_private_dir(dir: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::io(format!("create {}", dir.display()), e))
}

/// Read a secret or token file. Warns (without the content) when others may read it.
pub fn read_secret_file(path: &Path) -> Result<Secret> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        let kind = if e.kind() == std::io::ErrorKind::NotFound { ErrorKind::NotFound } else { ErrorKind::Io };
        Error::new(kind, format!("read {}: {e}", path.display()))
    })?;
    if let Ok(m) = std::fs::metadata(path)
        && m.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(path = %path.display(), "credential file is readable by other users: chmod 600 it");
    }
    Secret::new(&text).map_err(|e| e.context(path.display()))
}

/// The master's secret: read `security.secret_file`, or make a new one there (and the
/// client token at `security.token_file`) when it does not exist.
pub fn load_or_create_secret(cfg: &SecurityConfig) -> Result<Secret> {
    match read_secret_file(&cfg.secret_file) {
        Ok(s) => {
            if !cfg.token_file.exists() {
                write_private(&cfg.token_file, s.client_token().expose())?;
            }
            Ok(s)
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {
            let s = Secret::generate();
            write_private(&cfg.secret_file, s.expose())?;
            write_private(&cfg.token_file, s.client_token().expose())?;
            tracing::info!(secret = %cfg.secret_file.display(), token = %cfg.token_file.display(), "made a new cluster secret and client token");
            Ok(s)
        }
        Err(e) => Err(e),
    }
}

/// A worker's secret: `security.secret_file`, waiting up to `wait` for a master starting
/// beside it to make the file.
pub fn wait_for_secret(cfg: &SecurityConfig, wait: Duration) -> Result<Secret> {
    let deadline = Instant::now() + wait;
    loop {
        match read_secret_file(&cfg.secret_file) {
            Err(e) if e.kind() == ErrorKind::NotFound && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(Error::new(
                    ErrorKind::Unauthenticated,
                    format!(
                        "no cluster secret at {} (the master makes it at first start; copy it here, or set \
                         security.secret_file / LOCUS_SECURITY__SECRET_FILE)",
                        cfg.secret_file.display()
                    ),
                ));
            }
            r => return r,
        }
    }
}

/// A client's credential: the token file, else the client token of the secret file (a
/// client on the master's host), else an error saying where it looked.
pub fn client_credential(cfg: &SecurityConfig) -> Result<Secret> {
    match read_secret_file(&cfg.token_file) {
        Ok(t) => Ok(t),
        Err(e) if e.kind() == ErrorKind::NotFound => match read_secret_file(&cfg.secret_file) {
            Ok(s) => Ok(s.client_token()),
            Err(e2) if e2.kind() == ErrorKind::NotFound => Err(Error::new(
                ErrorKind::Unauthenticated,
                format!(
                    "no client token at {} (the master writes client.token beside its cluster secret; \
                     set security.token_file or LOCUS_SECURITY__TOKEN_FILE to it)",
                    cfg.token_file.display()
                ),
            )),
            Err(e2) => Err(e2),
        },
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_follow_the_credential_presented() {
        let s = Secret::generate();
        let v = Verifier::new(&s);
        assert_eq!(v.role(s.expose()), Some(Role::Worker));
        assert_eq!(v.role(s.client_token().expose()), Some(Role::Client));
        assert_eq!(v.role(""), None);
        assert_eq!(v.role(&s.expose()[1..]), None);
        let mut wrong = s.expose().to_string();
        wrong.replace_range(0..1, if wrong.starts_with('a') { "b" } else { "a" });
        assert_eq!(v.role(&wrong), None);
        // Another cluster's token is not this one's.
        assert_eq!(v.role(Secret::generate().client_token().expose()), None);
        assert_eq!(s.client_token(), s.client_token());
        assert_ne!(s.client_token().expose(), s.expose());
    }

    #[test]
    fn proofs_bind_the_key_the_role_and_the_nonce() {
        let s = Secret::generate();
        let v = Verifier::new(&s);
        let (n1, n2) = (b"nonce one".as_slice(), b"nonce two".as_slice());
        let client = Identity::client(&s.client_token());
        assert!(v.check(Role::Client, n1, &client.prove(n1)));
        // A proof is for one nonce: a listener that captured it cannot replay it.
        assert!(!v.check(Role::Client, n2, &client.prove(n1)));
        // The client token never proves a member's role.
        for r in [Role::Worker, Role::Master] {
            assert!(!v.check(r, n1, &client.prove(n1)));
            assert!(!v.check(r, n1, &Identity { key: s.client_token(), role: r }.prove(n1)));
            assert!(v.check(r, n1, &v.identity(r).prove(n1)));
        }
        assert!(!v.check(Role::Master, n1, &v.identity(Role::Worker).prove(n1)));
        // Another cluster's members prove nothing here; the proof holds no key.
        let other = Verifier::new(&Secret::generate());
        assert!(!v.check(Role::Worker, n1, &other.identity(Role::Worker).prove(n1)));
        let p = client.prove(n1);
        assert!(!String::from_utf8_lossy(&p).contains(s.client_token().expose()));
        // Grants: for one mount, path and version, made with the cluster secret only.
        let g = v.grant(1, "a/b", 7);
        assert!(v.check_grant(1, "a/b", 7, &g));
        assert!(!v.check_grant(2, "a/b", 7, &g));
        assert!(!v.check_grant(1, "a/c", 7, &g));
        assert!(!v.check_grant(1, "a/b", 8, &g));
        assert!(!v.check_grant(1, "a/b", 7, &[]));
        assert!(!other.check_grant(1, "a/b", 7, &g));
        // Length-prefixed parts: a path cannot borrow the version's bytes.
        assert_ne!(v.grant(1, "a", 0x62), v.grant(1, "ab", 0));
    }

    #[test]
    fn rpc_nonces_are_the_masters_own_and_fresh() {
        let s = Secret::generate();
        let v = Verifier::new(&s);
        let n = v.nonce();
        assert!(v.fresh(&n));
        assert_ne!(n, v.nonce(), "each nonce is new");
        // Another cluster's, a changed one, an old one: not taken.
        assert!(!Verifier::new(&Secret::generate()).fresh(&n));
        assert!(v.clone().fresh(&n), "a clone serves the same port");
        assert!(Verifier::new(&s).fresh(&n), "the same port after a restart");
        let m1 = Verifier::issuing(&s, "rpc m1:19997");
        assert!(!Verifier::issuing(&s, "rpc m2:19997").fresh(&m1.nonce()), "another master's port");
        assert!(!v.fresh(&m1.nonce()));
        let mut bad = n.clone();
        bad[12] ^= 1;
        assert!(!v.fresh(&bad) && !v.fresh(&n[..40]) && !v.fresh(&[]));
        let old = 1_000u64.to_be_bytes();
        let mut stale = old.to_vec();
        stale.extend_from_slice(&n[8..24]);
        stale.extend_from_slice(&mac(&v.secret, &[NONCE_LABEL, &v.issuer, &stale]));
        assert!(!v.fresh(&stale), "a nonce from long ago");
    }

    #[test]
    fn a_member_proof_names_its_address_and_needs_the_secret() {
        let s = Secret::generate();
        let v = Verifier::new(&s);
        let p = v.member_proof("m1:19997", b"n1");
        assert!(v.check_member("m1:19997", b"n1", &p));
        assert!(!v.check_member("evil:19997", b"n1", &p), "relayed from another address");
        assert!(!v.check_member("m1:19997", b"n2", &p), "another nonce");
        assert!(!Verifier::new(&s.client_token()).check_member("m1:19997", b"n1", &p), "the client token");
    }

    #[test]
    fn a_ticket_binds_every_part_of_a_blocks_origin() {
        let s = Secret::generate();
        let v = Verifier::new(&s);
        let o = BlockOrigin {
            block_id: 9,
            mount_id: 1,
            ufs_path: "a/b",
            file_offset: 0,
            block_length: 64,
            fingerprint: "f1",
        };
        let t = v.ticket(&o);
        assert!(v.check_ticket(&o, &t));
        let changed = [
            BlockOrigin { block_id: 10, ..o },
            BlockOrigin { mount_id: 2, ..o },
            BlockOrigin { ufs_path: "a/c", ..o },
            BlockOrigin { file_offset: 64, ..o },
            BlockOrigin { block_length: 63, ..o },
            BlockOrigin { fingerprint: "f2", ..o },
            BlockOrigin { fingerprint: "", ..o },
        ];
        for c in changed {
            assert!(!v.check_ticket(&c, &t), "{c:?}");
        }
        assert!(!v.check_ticket(&o, &[]));
        // Only the cluster secret makes one: not the client token, not another cluster.
        assert!(!Verifier::new(&s.client_token()).check_ticket(&o, &t));
        assert!(!Verifier::new(&Secret::generate()).check_ticket(&o, &t));
        assert_ne!(t, v.grant(1, "a/b", 9));
    }

    #[test]
    fn secrets_never_print() {
        let s = Secret::generate();
        assert!(!format!("{s:?} {s}").contains(s.expose()));
        assert!(!format!("{:?}", Verifier::new(&s)).contains(s.expose()));
        assert!(Secret::new("short").is_err());
        assert!(Secret::new("has a space inside it!!").is_err());
    }

    #[test]
    fn files_are_private_and_made_once() {
        let d = tempfile::tempdir().unwrap();
        let cfg = SecurityConfig {
            secret_file: d.path().join("sub/cluster.secret"),
            token_file: d.path().join("sub/client.token"),
            ..Default::default()
        };
        assert_eq!(client_credential(&cfg).unwrap_err().kind(), ErrorKind::Unauthenticated);
        assert_eq!(wait_for_secret(&cfg, Duration::from_millis(150)).unwrap_err().kind(), ErrorKind::Unauthenticated);
        let s = load_or_create_secret(&cfg).unwrap();
        for p in [&cfg.secret_file, &cfg.token_file] {
            assert_eq!(std::fs::metadata(p).unwrap().permissions().mode() & 0o777, 0o600, "{}", p.display());
        }
        assert_eq!(std::fs::metadata(d.path().join("sub")).unwrap().permissions().mode() & 0o777, 0o700);
        assert_eq!(load_or_create_secret(&cfg).unwrap(), s, "the secret is kept across starts");
        assert_eq!(client_credential(&cfg).unwrap(), s.client_token());
        assert_eq!(wait_for_secret(&cfg, Duration::ZERO).unwrap(), s);
        // Without the token file, a client on the master's host derives it.
        std::fs::remove_file(&cfg.token_file).unwrap();
        assert_eq!(client_credential(&cfg).unwrap(), s.client_token());
    }
}
