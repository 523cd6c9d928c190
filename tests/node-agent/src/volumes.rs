//! A pod's volumes, resolved to directories on the simulated node's disk:
//! - hostPath `/x` → `<cluster>/nodes/<node>/x` (each node has its own disk);
//! - persistentVolumeClaim → its bound PV's hostPath or local path, on this node;
//! - secret, configMap, projected (service account token, `ca.crt`, namespace, downward API) and
//!   emptyDir → files the agent writes under `<node>/var/lib/kubelet/pods/<uid>/volumes/<name>`.
//!
//! `fsGroup` is applied to what the agent owns (emptyDir, secrets, config maps, projected volumes and
//! local PVs) the way the kubelet does: group-owned, group-readable (writable when not read-only),
//! setgid directories. hostPath is never re-owned.

use std::collections::BTreeMap;
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, KeyToPath, PersistentVolume, PersistentVolumeClaim, Pod, Secret, ServiceAccount,
    Volume,
};
use kube::api::PostParams;
use kube::{Api, Client};

use crate::env::{PodFacts, field_value};
use crate::path_under;

/// One file of a secret-like volume: relative path, content, mode (None: the volume's default).
type VolumeFile = (String, Vec<u8>, Option<i32>);

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("failed to read {kind} {namespace}/{name} for volume {volume}")]
    Fetch {
        kind: &'static str,
        namespace: String,
        name: String,
        volume: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("{kind} {name} for volume {volume} does not exist")]
    Missing {
        kind: &'static str,
        name: String,
        volume: String,
    },
    #[error("claim {claim} of volume {volume} is not bound to a PersistentVolume yet")]
    Unbound { claim: String, volume: String },
    #[error("PersistentVolume {pv} (volume {volume}) is neither hostPath nor local")]
    UnsupportedPv { pv: String, volume: String },
    #[error(
        "volume {volume} has an unsupported type (supported: hostPath, persistentVolumeClaim, secret, configMap, emptyDir, projected, downwardAPI)"
    )]
    UnsupportedType { volume: String },
    #[error("path {path:?} of volume {volume} escapes its root")]
    BadPath { path: String, volume: String },
    #[error("key {key} not found in {kind} {name} for volume {volume}")]
    MissingKey {
        kind: &'static str,
        name: String,
        key: String,
        volume: String,
    },
    #[error("unsupported fieldPath {path} in volume {volume}")]
    UnsupportedField { path: String, volume: String },
    #[error("hostPath {path} of volume {volume} does not exist on this node (type {kind})")]
    HostPathMissing {
        path: PathBuf,
        volume: String,
        kind: String,
    },
    #[error(
        "failed to request a service account token for {namespace}/{service_account} (volume {volume})"
    )]
    Token {
        namespace: String,
        service_account: String,
        volume: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("failed to prepare {path} for volume {volume}")]
    Io {
        path: PathBuf,
        volume: String,
        #[source]
        source: std::io::Error,
    },
}

/// One resolved volume: the host directory (or file) its mounts bind from.
#[derive(Debug, Clone)]
pub struct ResolvedVolume {
    pub host_path: PathBuf,
    /// Whether the kubelet would present it read-only regardless of the mount (secrets, config maps...).
    pub always_read_only: bool,
}

/// Everything volume resolution needs to know about the pod and its node.
pub struct VolumeContext<'a> {
    pub client: &'a Client,
    pub node_root: &'a Path,
    pub pod_dir: &'a Path,
    pub pod: &'a Pod,
    pub facts: &'a PodFacts,
    pub fs_group: Option<i64>,
}

impl VolumeContext<'_> {
    fn namespace(&self) -> &str {
        self.pod.metadata.namespace.as_deref().unwrap_or("default")
    }

    fn io(&self, path: &Path, volume: &str) -> impl FnOnce(std::io::Error) -> VolumeError {
        let (path, volume) = (path.to_path_buf(), volume.to_string());
        move |source| VolumeError::Io {
            path,
            volume,
            source,
        }
    }

    /// Resolves every volume of the pod.
    pub async fn resolve_all(&self) -> Result<BTreeMap<String, ResolvedVolume>, VolumeError> {
        let mut out = BTreeMap::new();
        let volumes = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.clone())
            .unwrap_or_default();
        for volume in &volumes {
            out.insert(volume.name.clone(), self.resolve(volume).await?);
        }
        Ok(out)
    }

    async fn resolve(&self, v: &Volume) -> Result<ResolvedVolume, VolumeError> {
        let name = v.name.as_str();
        let managed_dir = self.pod_dir.join("volumes").join(name);
        if let Some(hp) = &v.host_path {
            let path = self.host_path(&hp.path, name)?;
            let kind = hp.type_.clone().unwrap_or_default();
            match kind.as_str() {
                "" | "DirectoryOrCreate" if !path.exists() => {
                    std::fs::create_dir_all(&path).map_err(self.io(&path, name))?;
                }
                "FileOrCreate" => {
                    if let Some(parent) = path.parent() {
                        std::fs::create_dir_all(parent).map_err(self.io(parent, name))?;
                    }
                    if !path.exists() {
                        std::fs::File::create(&path).map_err(self.io(&path, name))?;
                    }
                }
                "Directory" | "File" | "Socket" | "CharDevice" | "BlockDevice"
                    if !path.exists() =>
                {
                    return Err(VolumeError::HostPathMissing {
                        path,
                        volume: name.into(),
                        kind,
                    });
                }
                _ => {}
            }
            return Ok(ResolvedVolume {
                host_path: path,
                always_read_only: false,
            });
        }
        if let Some(claim) = &v.persistent_volume_claim {
            let path = self.claim_path(&claim.claim_name, name).await?;
            return Ok(ResolvedVolume {
                host_path: path,
                always_read_only: false,
            });
        }
        if v.empty_dir.is_some() {
            fresh_dir(&managed_dir).map_err(self.io(&managed_dir, name))?;
            std::fs::set_permissions(&managed_dir, std::fs::Permissions::from_mode(0o777))
                .map_err(self.io(&managed_dir, name))?;
            self.apply_fs_group(&managed_dir, name, false)?;
            return Ok(ResolvedVolume {
                host_path: managed_dir,
                always_read_only: false,
            });
        }
        let mut files: Vec<VolumeFile> = Vec::new();
        let default_mode;
        if let Some(s) = &v.secret {
            default_mode = s.default_mode;
            let secret_name = s.secret_name.clone().unwrap_or_default();
            let data = self
                .secret_data(&secret_name, name, s.optional.unwrap_or(false))
                .await?;
            files.extend(select_items(data, &s.items, "Secret", &secret_name, name)?);
        } else if let Some(c) = &v.config_map {
            default_mode = c.default_mode;
            let data = self
                .config_map_data(&c.name, name, c.optional.unwrap_or(false))
                .await?;
            files.extend(select_items(data, &c.items, "ConfigMap", &c.name, name)?);
        } else if let Some(d) = &v.downward_api {
            default_mode = d.default_mode;
            for item in d.items.iter().flatten() {
                let value = match &item.field_ref {
                    Some(f) => {
                        field_value(self.pod, self.facts, &f.field_path).ok_or_else(|| {
                            VolumeError::UnsupportedField {
                                path: f.field_path.clone(),
                                volume: name.into(),
                            }
                        })?
                    }
                    None => String::new(),
                };
                files.push((item.path.clone(), value.into_bytes(), item.mode));
            }
        } else if let Some(p) = &v.projected {
            default_mode = p.default_mode;
            for source in p.sources.iter().flatten() {
                if let Some(s) = &source.secret {
                    let data = self
                        .secret_data(&s.name, name, s.optional.unwrap_or(false))
                        .await?;
                    files.extend(select_items(data, &s.items, "Secret", &s.name, name)?);
                }
                if let Some(c) = &source.config_map {
                    let data = self
                        .config_map_data(&c.name, name, c.optional.unwrap_or(false))
                        .await?;
                    files.extend(select_items(data, &c.items, "ConfigMap", &c.name, name)?);
                }
                if let Some(d) = &source.downward_api {
                    for item in d.items.iter().flatten() {
                        if let Some(f) = &item.field_ref {
                            let value = field_value(self.pod, self.facts, &f.field_path)
                                .ok_or_else(|| VolumeError::UnsupportedField {
                                    path: f.field_path.clone(),
                                    volume: name.into(),
                                })?;
                            files.push((item.path.clone(), value.into_bytes(), item.mode));
                        }
                    }
                }
                if let Some(t) = &source.service_account_token {
                    let token = self
                        .token(t.audience.clone(), t.expiration_seconds, name)
                        .await?;
                    files.push((t.path.clone(), token.into_bytes(), None));
                }
            }
        } else {
            return Err(VolumeError::UnsupportedType {
                volume: name.into(),
            });
        }
        self.write_files(&managed_dir, name, files, default_mode.unwrap_or(0o644))?;
        Ok(ResolvedVolume {
            host_path: managed_dir,
            always_read_only: true,
        })
    }

    fn host_path(&self, path: &str, volume: &str) -> Result<PathBuf, VolumeError> {
        path_under(self.node_root, path).ok_or_else(|| VolumeError::BadPath {
            path: path.into(),
            volume: volume.into(),
        })
    }

    async fn claim_path(&self, claim: &str, volume: &str) -> Result<PathBuf, VolumeError> {
        let ns = self.namespace();
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
        let pvc = claims
            .get_opt(claim)
            .await
            .map_err(|source| self.fetch_err("PersistentVolumeClaim", claim, volume, source))?
            .ok_or_else(|| VolumeError::Missing {
                kind: "PersistentVolumeClaim",
                name: claim.into(),
                volume: volume.into(),
            })?;
        let pv_name = pvc
            .spec
            .and_then(|s| s.volume_name)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| VolumeError::Unbound {
                claim: claim.into(),
                volume: volume.into(),
            })?;
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let pv = pvs
            .get(&pv_name)
            .await
            .map_err(|source| self.fetch_err("PersistentVolume", &pv_name, volume, source))?;
        let spec = pv.spec.unwrap_or_default();
        if let Some(hp) = spec.host_path {
            let path = self.host_path(&hp.path, volume)?;
            std::fs::create_dir_all(&path).map_err(self.io(&path, volume))?;
            return Ok(path);
        }
        if let Some(local) = spec.local {
            // Like a real local PV the directory must exist on the node; the agent creates it so tests
            // and demos need not, but it lives only on this node's disk.
            let path = self.host_path(&local.path, volume)?;
            std::fs::create_dir_all(&path).map_err(self.io(&path, volume))?;
            self.apply_fs_group(&path, volume, false)?;
            return Ok(path);
        }
        Err(VolumeError::UnsupportedPv {
            pv: pv_name,
            volume: volume.into(),
        })
    }

    fn fetch_err(
        &self,
        kind: &'static str,
        name: &str,
        volume: &str,
        source: kube::Error,
    ) -> VolumeError {
        VolumeError::Fetch {
            kind,
            namespace: self.namespace().to_string(),
            name: name.into(),
            volume: volume.into(),
            source: Box::new(source),
        }
    }

    async fn secret_data(
        &self,
        secret: &str,
        volume: &str,
        optional: bool,
    ) -> Result<BTreeMap<String, Vec<u8>>, VolumeError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), self.namespace());
        match api
            .get_opt(secret)
            .await
            .map_err(|e| self.fetch_err("Secret", secret, volume, e))?
        {
            Some(s) => Ok(s
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect()),
            None if optional => Ok(BTreeMap::new()),
            None => Err(VolumeError::Missing {
                kind: "Secret",
                name: secret.into(),
                volume: volume.into(),
            }),
        }
    }

    async fn config_map_data(
        &self,
        cm: &str,
        volume: &str,
        optional: bool,
    ) -> Result<BTreeMap<String, Vec<u8>>, VolumeError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), self.namespace());
        match api
            .get_opt(cm)
            .await
            .map_err(|e| self.fetch_err("ConfigMap", cm, volume, e))?
        {
            Some(c) => {
                let mut out: BTreeMap<String, Vec<u8>> = c
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.into_bytes()))
                    .collect();
                out.extend(
                    c.binary_data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.0)),
                );
                Ok(out)
            }
            None if optional => Ok(BTreeMap::new()),
            None => Err(VolumeError::Missing {
                kind: "ConfigMap",
                name: cm.into(),
                volume: volume.into(),
            }),
        }
    }

    async fn token(
        &self,
        audience: Option<String>,
        expiration: Option<i64>,
        volume: &str,
    ) -> Result<String, VolumeError> {
        let ns = self.namespace();
        let sa = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), ns);
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: audience.into_iter().collect(),
                expiration_seconds: expiration,
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: self.pod.metadata.name.clone(),
                    uid: self.pod.metadata.uid.clone(),
                }),
            },
            ..Default::default()
        };
        let response = api
            .create_token_request(&sa, &PostParams::default(), &request)
            .await
            .map_err(|source| VolumeError::Token {
                namespace: ns.into(),
                service_account: sa.clone(),
                volume: volume.into(),
                source: Box::new(source),
            })?;
        Ok(response.status.map(|s| s.token).unwrap_or_default())
    }

    /// Writes a secret-like volume from scratch: every file, its mode, then fsGroup ownership.
    fn write_files(
        &self,
        dir: &Path,
        volume: &str,
        files: Vec<VolumeFile>,
        default_mode: i32,
    ) -> Result<(), VolumeError> {
        fresh_dir(dir).map_err(self.io(dir, volume))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
            .map_err(self.io(dir, volume))?;
        for (rel, bytes, mode) in files {
            let path = path_under(dir, &rel).ok_or_else(|| VolumeError::BadPath {
                path: rel.clone(),
                volume: volume.into(),
            })?;
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(self.io(parent, volume))?;
            }
            std::fs::write(&path, &bytes).map_err(self.io(&path, volume))?;
            let mode = u32::try_from(mode.unwrap_or(default_mode) & 0o7777).unwrap_or(0o644);
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .map_err(self.io(&path, volume))?;
        }
        self.apply_fs_group(dir, volume, true)
    }

    /// Group-owns `path` (recursively) by fsGroup: directories setgid and group rwx (r-x when
    /// read-only), files group-readable (and writable unless read-only).
    fn apply_fs_group(
        &self,
        path: &Path,
        volume: &str,
        read_only: bool,
    ) -> Result<(), VolumeError> {
        let Some(gid) = self.fs_group.and_then(|g| u32::try_from(g).ok()) else {
            return Ok(());
        };
        let mut stack = vec![path.to_path_buf()];
        while let Some(p) = stack.pop() {
            let meta = std::fs::symlink_metadata(&p).map_err(self.io(&p, volume))?;
            if meta.file_type().is_symlink() {
                continue;
            }
            chown(&p, None, Some(gid)).map_err(self.io(&p, volume))?;
            let mode = meta.permissions().mode() & 0o7777;
            let new_mode = if meta.is_dir() {
                for entry in std::fs::read_dir(&p).map_err(self.io(&p, volume))? {
                    stack.push(entry.map_err(self.io(&p, volume))?.path());
                }
                mode | 0o2000 | if read_only { 0o050 } else { 0o070 }
            } else {
                mode | if read_only { 0o040 } else { 0o060 }
            };
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(new_mode))
                .map_err(self.io(&p, volume))?;
        }
        Ok(())
    }
}

/// The files a secret/config map volume shows: every key, or only the listed items at their paths.
fn select_items(
    data: BTreeMap<String, Vec<u8>>,
    items: &Option<Vec<KeyToPath>>,
    kind: &'static str,
    name: &str,
    volume: &str,
) -> Result<Vec<VolumeFile>, VolumeError> {
    match items {
        None => Ok(data.into_iter().map(|(k, v)| (k, v, None)).collect()),
        Some(items) => items
            .iter()
            .map(|item| {
                let bytes =
                    data.get(&item.key)
                        .cloned()
                        .ok_or_else(|| VolumeError::MissingKey {
                            kind,
                            name: name.into(),
                            key: item.key.clone(),
                            volume: volume.into(),
                        })?;
                Ok((item.path.clone(), bytes, item.mode))
            })
            .collect(),
    }
}

/// Removes whatever is at `dir` and creates it empty.
fn fresh_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::create_dir_all(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_items_maps_keys_to_paths_and_reports_missing_keys() {
        let data: BTreeMap<String, Vec<u8>> = [
            ("a".to_string(), b"1".to_vec()),
            ("b".to_string(), b"2".to_vec()),
        ]
        .into_iter()
        .collect();
        let all = select_items(data.clone(), &None, "Secret", "s", "v").unwrap();
        assert_eq!(all.len(), 2);
        let items = Some(vec![KeyToPath {
            key: "b".into(),
            path: "sub/b.txt".into(),
            mode: Some(0o600),
        }]);
        let picked = select_items(data.clone(), &items, "Secret", "s", "v").unwrap();
        assert_eq!(
            picked,
            vec![("sub/b.txt".to_string(), b"2".to_vec(), Some(0o600))]
        );
        let bad = Some(vec![KeyToPath {
            key: "zzz".into(),
            path: "z".into(),
            mode: None,
        }]);
        let err = select_items(data, &bad, "Secret", "s", "v").unwrap_err();
        assert!(
            err.to_string().contains("key zzz not found in Secret s"),
            "{err}"
        );
    }
}
