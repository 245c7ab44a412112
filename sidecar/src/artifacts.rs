//! The worker's content-addressed artifact cache (`<cache>/sha256/<digest>/`): a placement
//! names its base model and adapter by sha256 (docs/protocol.md); what the cache lacks is
//! fetched from the artifact source (format `tree-v1`: manifest `tree.<sha256>`, one object
//! `file.<sha256>` per file) — the NATS object store `artifacts` by default, or an
//! S3-compatible bucket (`--artifact-source s3://bucket/prefix`, see `s3.rs`) — every file hashed while it is written to a staging folder,
//! the folder's digest checked against the placement's, and only then renamed into place. A
//! folder found in the cache (another worker on this machine, an earlier run) is hashed once per
//! process before its first load. A mismatch is a `LOAD_FAILED` naming both digests: nothing
//! that does not hash to the placement's digest is ever loaded.
//!
//! With a size limit (`--artifact-cache-max-bytes`), each fetch is followed by eviction: the
//! least recently used folders that no current placement of this worker names are removed
//! until the cache fits (what current placements need is never removed, even over the limit).

use std::collections::{HashMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use async_nats::jetstream::{self, object_store};
use ring::digest::{Context, SHA256};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::OnceCell;

use crate::error::{Error, Result};
use crate::protocol::{self, ArtifactRef, Code, ErrorBody};
use crate::s3::S3Source;

/// The declared object store of artifacts (contract/shared.toml).
fn artifacts_bucket() -> &'static str {
    &crate::contract::declared()
        .nats
        .object_stores
        .artifacts
        .bucket
}
pub const FORMAT: &str = "tree-v1";

#[derive(Debug, Deserialize)]
struct ManifestFile {
    path: String,
    sha256: String,
    size: u64,
}

#[derive(Debug, Deserialize)]
struct Manifest {
    #[allow(dead_code)]
    v: u32,
    format: String,
    sha256: String,
    #[allow(dead_code)]
    size: u64,
    files: Vec<ManifestFile>,
}

/// Where artifacts are fetched from.
pub enum Source {
    /// The NATS object store `artifacts` (nothing else to run).
    Nats(jetstream::Context),
    /// An S3-compatible bucket, read with signed GETs.
    S3(S3Source, reqwest::Client),
}

impl Source {
    pub fn describe(&self) -> String {
        match self {
            Source::Nats(_) => format!("object store {}", artifacts_bucket()),
            Source::S3(s3, _) => s3.describe(),
        }
    }
}

/// One object being read, from whichever source.
enum Body {
    Nats(Box<object_store::Object>),
    S3(reqwest::Response),
}

impl Body {
    /// The next bytes of the object into `buf` (NATS) or as a chunk (S3); None at the end.
    async fn next(&mut self, buf: &mut [u8]) -> std::io::Result<Option<bytes::Bytes>> {
        match self {
            Body::Nats(object) => {
                let n = object.read(buf).await?;
                Ok((n > 0).then(|| bytes::Bytes::copy_from_slice(&buf[..n])))
            }
            Body::S3(response) => response.chunk().await.map_err(std::io::Error::other),
        }
    }
}

pub struct ArtifactCache {
    dir: PathBuf,
    source: Source,
    store: OnceCell<object_store::ObjectStore>,
    /// Digests whose folder this process has hashed (or fetched and hashed).
    verified: Mutex<HashSet<String>>,
    /// One fetch or check at a time: two placements naming one base fetch it once.
    busy: tokio::sync::Mutex<()>,
    /// Most bytes the cache may hold (0: no limit).
    max_bytes: u64,
    /// Digests the current placements of this worker name: never evicted.
    in_use: Mutex<HashSet<String>>,
    /// When this process last used each digest (folders it has not used: their mtime).
    last_used: Mutex<HashMap<String, SystemTime>>,
}

fn load_failed(message: String, retryable: bool) -> Error {
    Error::Runtime(ErrorBody::new(Code::LoadFailed, &message).retryable(retryable))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn valid_digest(digest: &str) -> bool {
    digest.len() == 64
        && digest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The registry's fingerprint (registry/fingerprint.py `tree_sha256`) over (relative path,
/// file sha256) pairs: sha256 of "path NUL file-sha256 LF" for each, in path order.
pub fn tree_digest(mut files: Vec<(String, String)>) -> String {
    files.sort();
    let mut ctx = Context::new(&SHA256);
    for (path, sha) in files {
        ctx.update(path.as_bytes());
        ctx.update(b"\0");
        ctx.update(sha.as_bytes());
        ctx.update(b"\n");
    }
    hex(ctx.finish().as_ref())
}

/// The fingerprint of a folder on disk (every regular file under it).
pub fn folder_digest(root: &Path) -> std::io::Result<String> {
    let mut files = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                let rel = entry
                    .path()
                    .strip_prefix(root)
                    .expect("under root")
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("/");
                files.push((rel, file_sha256(&entry.path())?));
            }
        }
    }
    Ok(tree_digest(files))
}

/// Bytes of the files under `root` (0 when unreadable).
fn tree_size(root: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(root) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_size(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

fn file_sha256(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut ctx = Context::new(&SHA256);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(hex(ctx.finish().as_ref()));
        }
        ctx.update(&buf[..n]);
    }
}

/// A manifest path must stay inside the artifact's folder.
fn safe_relative(path: &str) -> Option<PathBuf> {
    let p = Path::new(path);
    let ok = !path.is_empty()
        && p.components().all(|c| matches!(c, Component::Normal(_)))
        && !path.contains('\\');
    ok.then(|| p.to_path_buf())
}

impl ArtifactCache {
    pub fn new(dir: PathBuf, source: Source) -> Self {
        Self {
            dir,
            source,
            store: OnceCell::new(),
            verified: Mutex::default(),
            busy: tokio::sync::Mutex::new(()),
            max_bytes: 0,
            in_use: Mutex::default(),
            last_used: Mutex::default(),
        }
    }

    /// The same cache holding at most `max_bytes` (0: no limit).
    pub fn with_limit(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// The digests the current placements name (replacing the previous set): kept in the
    /// cache whatever its limit.
    pub fn set_in_use(&self, digests: HashSet<String>) {
        *self.in_use.lock().expect("in_use lock") = digests;
    }

    fn touch(&self, digest: &str) {
        self.last_used
            .lock()
            .expect("last_used lock")
            .insert(digest.into(), SystemTime::now());
    }

    /// Removes least recently used folders no current placement names until the cache holds
    /// at most `max_bytes` (`keep`: the digest just fetched). Returns the digests removed.
    pub fn evict(&self, keep: &str) -> Vec<String> {
        if self.max_bytes == 0 {
            return Vec::new();
        }
        let root = self.dir.join("sha256");
        let Ok(entries) = std::fs::read_dir(&root) else {
            return Vec::new();
        };
        let in_use = self.in_use.lock().expect("in_use lock").clone();
        let last_used = self.last_used.lock().expect("last_used lock").clone();
        let mut folders: Vec<(SystemTime, String, u64)> = Vec::new();
        let mut total = 0u64;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !valid_digest(&name) {
                continue;
            }
            let size = tree_size(&entry.path());
            total += size;
            let used = last_used.get(&name).copied().unwrap_or_else(|| {
                entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .unwrap_or(SystemTime::UNIX_EPOCH)
            });
            folders.push((used, name, size));
        }
        folders.sort();
        let mut removed = Vec::new();
        for (_, name, size) in folders {
            if total <= self.max_bytes {
                break;
            }
            if name == keep || in_use.contains(&name) {
                continue;
            }
            match std::fs::remove_dir_all(root.join(&name)) {
                Ok(()) => {
                    total -= size;
                    self.verified.lock().expect("verified lock").remove(&name);
                    self.last_used.lock().expect("last_used lock").remove(&name);
                    tracing::info!(sha256 = %name, bytes = size, "evicted artifact from the cache");
                    removed.push(name);
                }
                Err(e) => tracing::warn!(sha256 = %name, error = %e, "cannot evict artifact"),
            }
        }
        if total > self.max_bytes {
            tracing::warn!(
                bytes = total,
                limit = self.max_bytes,
                "artifact cache over its limit: the rest is named by current placements"
            );
        }
        removed
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the artifact lives once cached; what the runtime is told to load.
    pub fn path(&self, digest: &str) -> PathBuf {
        self.dir.join("sha256").join(digest)
    }

    async fn nats_store(&self, js: &jetstream::Context) -> Result<object_store::ObjectStore> {
        self.store
            .get_or_try_init(|| async {
                js.get_object_store(artifacts_bucket()).await.map_err(|e| {
                    load_failed(format!("no object store {}: {e}", artifacts_bucket()), true)
                })
            })
            .await
            .cloned()
    }

    /// One object of the source; `Ok(None)` when the source does not hold it.
    async fn open(&self, name: &str) -> Result<Option<Body>> {
        match &self.source {
            Source::Nats(js) => match self.nats_store(js).await?.get(name).await {
                Ok(object) => Ok(Some(Body::Nats(Box::new(object)))),
                Err(e) if e.kind() == object_store::GetErrorKind::NotFound => Ok(None),
                Err(e) => Err(load_failed(
                    format!("reading {name} from {}: {e}", self.source.describe()),
                    true,
                )),
            },
            Source::S3(s3, client) => {
                let response = s3.get(client, name).send().await.map_err(|e| {
                    load_failed(format!("reading {name} from {}: {e}", s3.describe()), true)
                })?;
                let status = response.status();
                if status == reqwest::StatusCode::NOT_FOUND {
                    return Ok(None);
                }
                if !status.is_success() {
                    let body = response.text().await.unwrap_or_default();
                    let body: String = body.chars().take(300).collect();
                    // 403 and the like are configuration (credentials, policy): retried, since an
                    // operator may fix them while the placement stands.
                    return Err(load_failed(
                        format!(
                            "reading {name} from {}: HTTP {status}: {body}",
                            s3.describe()
                        ),
                        true,
                    ));
                }
                Ok(Some(Body::S3(response)))
            }
        }
    }

    /// The artifact's folder in the cache, fetched and verified when missing; an error when
    /// it cannot be had with the right digest.
    pub async fn ensure(&self, artifact: &ArtifactRef) -> Result<PathBuf> {
        let digest = artifact.sha256.as_str();
        if artifact.format != FORMAT {
            return Err(load_failed(
                format!(
                    "artifact {digest} has format {:?}; this worker reads {FORMAT}",
                    artifact.format
                ),
                false,
            ));
        }
        if !valid_digest(digest) {
            return Err(load_failed(
                format!("artifact digest {digest:?} is not a sha256"),
                false,
            ));
        }
        let path = self.path(digest);
        let _busy = self.busy.lock().await;
        if self
            .verified
            .lock()
            .expect("verified lock")
            .contains(digest)
            && path.is_dir()
        {
            self.touch(digest);
            return Ok(path);
        }
        if path.is_dir() {
            let found = {
                let path = path.clone();
                tokio::task::spawn_blocking(move || folder_digest(&path))
                    .await
                    .map_err(|e| load_failed(format!("hashing the cache: {e}"), true))??
            };
            if found == digest {
                tracing::info!(sha256 = %digest, "artifact found in the cache and verified");
                self.verified
                    .lock()
                    .expect("verified lock")
                    .insert(digest.into());
                self.touch(digest);
                return Ok(path);
            }
            tracing::error!(
                sha256 = %digest, found = %found,
                "cached artifact does not hash to its name; fetching it again"
            );
            std::fs::remove_dir_all(&path)?;
        }
        self.fetch(artifact, &path).await?;
        self.verified
            .lock()
            .expect("verified lock")
            .insert(digest.into());
        self.touch(digest);
        self.evict(digest);
        Ok(path)
    }

    async fn fetch(&self, artifact: &ArtifactRef, dest: &Path) -> Result<()> {
        let digest = artifact.sha256.as_str();
        let manifest_name = format!("tree.{digest}");
        let Some(mut object) = self.open(&manifest_name).await? else {
            return Err(load_failed(
                format!(
                    "artifact {digest} is not in {}; the control plane uploads it before publishing",
                    self.source.describe()
                ),
                true,
            ));
        };
        let mut bytes = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        while let Some(chunk) = object
            .next(&mut buf)
            .await
            .map_err(|e| load_failed(format!("reading manifest of {digest}: {e}"), true))?
        {
            bytes.extend_from_slice(&chunk);
        }
        let manifest: Manifest = protocol::decode(&bytes)
            .map_err(|e| load_failed(format!("manifest of {digest} unreadable: {e}"), false))?;
        if manifest.format != FORMAT || manifest.sha256 != digest {
            return Err(load_failed(
                format!(
                    "manifest {manifest_name} names {} ({}), not {digest}",
                    manifest.sha256, manifest.format
                ),
                false,
            ));
        }
        let staging_root = self.dir.join("staging");
        let staging = staging_root.join(format!(
            "{digest}-{}-{}",
            std::process::id(),
            crate::clock::now_ms()
        ));
        tokio::fs::create_dir_all(&staging).await?;
        let written = self.write_files(&manifest, &staging).await;
        let result = written.and_then(|pairs| {
            let found = tree_digest(pairs);
            if found == digest {
                Ok(())
            } else {
                Err(load_failed(
                    format!("artifact fetched for {digest} hashes to {found}: not loaded"),
                    false,
                ))
            }
        });
        if let Err(e) = result {
            let _ = tokio::fs::remove_dir_all(&staging).await;
            return Err(e);
        }
        if let Some(parent) = dest.parent() {
            tokio::fs::create_dir_all(parent).await?;
        }
        if let Err(e) = tokio::fs::rename(&staging, dest).await {
            // Another worker sharing this cache put it there first: theirs is as good.
            let _ = tokio::fs::remove_dir_all(&staging).await;
            if !dest.is_dir() {
                return Err(e.into());
            }
        }
        tracing::info!(
            sha256 = %digest,
            files = manifest.files.len(),
            bytes = artifact.size,
            "artifact fetched and verified"
        );
        Ok(())
    }

    /// Every file of the manifest into `staging`, each hashed as it is written; returns the
    /// (path, sha256) pairs actually written.
    async fn write_files(
        &self,
        manifest: &Manifest,
        staging: &Path,
    ) -> Result<Vec<(String, String)>> {
        let mut pairs = Vec::with_capacity(manifest.files.len());
        let mut buf = vec![0u8; 1 << 16];
        for file in &manifest.files {
            let Some(rel) = safe_relative(&file.path) else {
                return Err(load_failed(
                    format!("manifest path {:?} leaves the folder", file.path),
                    false,
                ));
            };
            let target = staging.join(rel);
            if let Some(parent) = target.parent() {
                tokio::fs::create_dir_all(parent).await?;
            }
            let Some(mut object) = self.open(&format!("file.{}", file.sha256)).await? else {
                return Err(load_failed(
                    format!(
                        "file {} ({}) missing from {}",
                        file.path,
                        file.sha256,
                        self.source.describe()
                    ),
                    true,
                ));
            };
            let mut out = tokio::fs::File::create(&target).await?;
            let mut ctx = Context::new(&SHA256);
            let mut size = 0u64;
            while let Some(chunk) = object
                .next(&mut buf)
                .await
                .map_err(|e| load_failed(format!("reading {}: {e}", file.path), true))?
            {
                ctx.update(&chunk);
                out.write_all(&chunk).await?;
                size += chunk.len() as u64;
            }
            out.flush().await?;
            let sha = hex(ctx.finish().as_ref());
            if sha != file.sha256 || size != file.size {
                return Err(load_failed(
                    format!(
                        "file {} of artifact {}: got {size} bytes hashing to {sha}, expected {} bytes hashing to {}",
                        file.path, manifest.sha256, file.size, file.sha256
                    ),
                    false,
                ));
            }
            pairs.push((file.path.clone(), sha));
        }
        Ok(pairs)
    }
}

#[cfg(test)]
mod tests {
    use super::{folder_digest, safe_relative, tree_digest, valid_digest};
    use super::{ArtifactCache, Source};
    use crate::s3::{Credentials, S3Source};
    use std::collections::HashSet;

    fn cache_with(dir: &std::path::Path, limit: u64) -> ArtifactCache {
        let s3 = S3Source::new(
            "s3://unused-bucket",
            "us-east-1".into(),
            None,
            Credentials {
                access_key_id: "x".into(),
                secret_access_key: "y".into(),
                session_token: None,
            },
        )
        .unwrap();
        ArtifactCache::new(dir.into(), Source::S3(s3, reqwest::Client::new())).with_limit(limit)
    }

    fn folder(cache: &ArtifactCache, digit: char, bytes: usize) -> String {
        let digest: String = std::iter::repeat_n(digit, 64).collect();
        let path = cache.path(&digest).join("sub");
        std::fs::create_dir_all(&path).unwrap();
        std::fs::write(path.join("weights"), vec![0u8; bytes]).unwrap();
        cache.touch(&digest);
        std::thread::sleep(std::time::Duration::from_millis(5)); // distinct use times
        digest
    }

    #[test]
    fn eviction_removes_least_recently_used_unneeded_folders_first() {
        let dir = tempfile::tempdir().unwrap();
        let cache = cache_with(dir.path(), 250);
        let (a, b, c) = (
            folder(&cache, 'a', 100),
            folder(&cache, 'b', 100),
            folder(&cache, 'c', 100),
        );
        cache.touch(&a); // a used again: b is now the least recently used
        assert_eq!(cache.evict(&c), vec![b.clone()]);
        assert!(cache.path(&a).is_dir() && cache.path(&c).is_dir() && !cache.path(&b).exists());
        assert!(cache.evict(&c).is_empty(), "200 bytes fit in 250");
    }

    #[test]
    fn what_current_placements_name_is_kept_even_over_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let cache = cache_with(dir.path(), 150);
        let (a, b, c) = (
            folder(&cache, 'a', 100),
            folder(&cache, 'b', 100),
            folder(&cache, 'c', 100),
        );
        cache.set_in_use(HashSet::from([a.clone()]));
        assert_eq!(cache.evict(&c), vec![b.clone()]); // a in use, c just fetched
        assert!(cache.path(&a).is_dir() && cache.path(&c).is_dir());
        let unlimited = cache_with(dir.path(), 0);
        assert!(unlimited.evict(&c).is_empty());
    }

    #[test]
    fn digest_of_a_folder_is_the_registrys() {
        // Same bytes as registry.fingerprint.tree_sha256 over a folder holding a/b.txt = "x"
        // and c.txt = "" (computed with Python).
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        std::fs::write(dir.path().join("a/b.txt"), "x").unwrap();
        std::fs::write(dir.path().join("c.txt"), "").unwrap();
        let digest = folder_digest(dir.path()).unwrap();
        assert_eq!(
            digest,
            tree_digest(vec![
                (
                    "c.txt".into(),
                    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855".into()
                ),
                (
                    "a/b.txt".into(),
                    "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881".into()
                ),
            ])
        );
        assert_eq!(digest, PYTHON_DIGEST);
    }

    const PYTHON_DIGEST: &str = "00987d7ee28ebb057d5a1a94dc2446d9f209170ac1303e9726648aff818ed411";

    #[test]
    fn manifest_paths_stay_inside() {
        assert!(safe_relative("1_Pooling/config.json").is_some());
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "a\\b"] {
            assert!(safe_relative(bad).is_none(), "{bad}");
        }
        assert!(valid_digest(&"a".repeat(64)));
        assert!(!valid_digest("../../etc"));
        assert!(!valid_digest(&"A".repeat(64)));
    }
}
