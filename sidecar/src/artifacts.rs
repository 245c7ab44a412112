//! The worker's content-addressed artifact cache (`<cache>/sha256/<digest>/`): a placement
//! names its base model and adapter by sha256 (docs/protocol.md); what the cache lacks is
//! fetched from the object store `artifacts` (format `tree-v1`: manifest `tree.<sha256>`, one
//! object `file.<sha256>` per file), every file hashed while it is written to a staging folder,
//! the folder's digest checked against the placement's, and only then renamed into place. A
//! folder found in the cache (another worker on this machine, an earlier run) is hashed once per
//! process before its first load. A mismatch is a `LOAD_FAILED` naming both digests: nothing
//! that does not hash to the placement's digest is ever loaded.

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

use async_nats::jetstream::{self, object_store};
use ring::digest::{Context, SHA256};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::OnceCell;

use crate::error::{Error, Result};
use crate::protocol::{self, ArtifactRef, ErrorBody};

pub const ARTIFACTS_BUCKET: &str = "artifacts";
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

pub struct ArtifactCache {
    dir: PathBuf,
    js: jetstream::Context,
    store: OnceCell<object_store::ObjectStore>,
    /// Digests whose folder this process has hashed (or fetched and hashed).
    verified: Mutex<HashSet<String>>,
    /// One fetch or check at a time: two placements naming one base fetch it once.
    busy: tokio::sync::Mutex<()>,
}

fn load_failed(message: String, retryable: bool) -> Error {
    Error::Runtime(ErrorBody::new("LOAD_FAILED", &message, retryable))
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
    pub fn new(dir: PathBuf, js: jetstream::Context) -> Self {
        Self {
            dir,
            js,
            store: OnceCell::new(),
            verified: Mutex::default(),
            busy: tokio::sync::Mutex::new(()),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the artifact lives once cached; what the runtime is told to load.
    pub fn path(&self, digest: &str) -> PathBuf {
        self.dir.join("sha256").join(digest)
    }

    async fn store(&self) -> Result<object_store::ObjectStore> {
        self.store
            .get_or_try_init(|| async {
                self.js
                    .get_object_store(ARTIFACTS_BUCKET)
                    .await
                    .map_err(|e| {
                        load_failed(format!("no object store {ARTIFACTS_BUCKET}: {e}"), true)
                    })
            })
            .await
            .cloned()
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
        Ok(path)
    }

    async fn fetch(&self, artifact: &ArtifactRef, dest: &Path) -> Result<()> {
        let digest = artifact.sha256.as_str();
        let store = self.store().await?;
        let manifest_name = format!("tree.{digest}");
        let mut object = store.get(&manifest_name).await.map_err(|e| {
            load_failed(
                format!("artifact {digest} is not in object store {ARTIFACTS_BUCKET} ({e}); the control plane uploads it before publishing"),
                true,
            )
        })?;
        let mut bytes = Vec::new();
        object
            .read_to_end(&mut bytes)
            .await
            .map_err(|e| load_failed(format!("reading manifest of {digest}: {e}"), true))?;
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
            crate::worker::now_ms()
        ));
        tokio::fs::create_dir_all(&staging).await?;
        let written = self.write_files(&store, &manifest, &staging).await;
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
        store: &object_store::ObjectStore,
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
            let mut object = store
                .get(format!("file.{}", file.sha256))
                .await
                .map_err(|e| {
                    load_failed(
                        format!(
                            "file {} ({}) missing from {ARTIFACTS_BUCKET}: {e}",
                            file.path, file.sha256
                        ),
                        true,
                    )
                })?;
            let mut out = tokio::fs::File::create(&target).await?;
            let mut ctx = Context::new(&SHA256);
            let mut size = 0u64;
            loop {
                let n = object
                    .read(&mut buf)
                    .await
                    .map_err(|e| load_failed(format!("reading {}: {e}", file.path), true))?;
                if n == 0 {
                    break;
                }
                ctx.update(&buf[..n]);
                out.write_all(&buf[..n]).await?;
                size += n as u64;
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
