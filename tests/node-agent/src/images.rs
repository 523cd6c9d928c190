//! Image → local binary. No container runtime exists here, so an image stands for a binary built in
//! this workspace: the repository's last path component names a file in the bin dir
//! (`registry/x/ferry-mover:v1` → `<bin-dir>/ferry-mover`), unless an explicit override matches first.
//! An image with no binary behind it runs its `command` from the host's userland (like `busybox`).
//!
//! The images ferry ships are declared in `deploy/Dockerfile`; given that file, an image whose
//! repository's last component names one of its stages runs that stage's ENTRYPOINT binary (by
//! file name, from the bin dir) as that stage's USER unless the pod sets its own, exactly as a
//! container runtime would. So a pod spec that only works because the agent is lenient (a missing
//! command, a user the image does not declare) fails here too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What a Dockerfile stage declares about the image it builds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageDecl {
    /// ENTRYPOINT in exec form.
    pub entrypoint: Vec<String>,
    /// USER as uid and gid (numeric only: a name would need the image's /etc/passwd).
    pub user: Option<(u32, u32)>,
}

/// The stages of a Dockerfile by name (`FROM ... AS name`), with their ENTRYPOINT and USER.
pub fn parse_dockerfile(text: &str) -> Result<BTreeMap<String, ImageDecl>, String> {
    let mut stages = BTreeMap::new();
    let mut current: Option<(String, ImageDecl)> = None;
    // Continuation lines join their instruction; comments and blank lines go.
    let mut logical = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let t = line.trim();
        if pending.is_empty() && (t.is_empty() || t.starts_with('#')) {
            continue;
        }
        match t.strip_suffix('\\') {
            Some(head) => {
                pending.push_str(head);
                pending.push(' ');
            }
            None => {
                pending.push_str(t);
                logical.push(std::mem::take(&mut pending));
            }
        }
    }
    for line in logical {
        let (word, rest) = line.split_once(char::is_whitespace).unwrap_or((&line, ""));
        let rest = rest.trim();
        match word.to_ascii_uppercase().as_str() {
            "FROM" => {
                stages.extend(current.take());
                let parts: Vec<&str> = rest.split_whitespace().collect();
                if let [.., as_kw, name] = parts.as_slice()
                    && as_kw.eq_ignore_ascii_case("as")
                {
                    current = Some((
                        name.to_string(),
                        ImageDecl {
                            entrypoint: Vec::new(),
                            user: None,
                        },
                    ));
                }
            }
            "ENTRYPOINT" => {
                if let Some((name, decl)) = current.as_mut() {
                    decl.entrypoint = serde_json::from_str(rest).map_err(|e| {
                        format!("stage {name}: ENTRYPOINT must be in exec form ({rest}): {e}")
                    })?;
                }
            }
            "USER" => {
                if let Some((name, decl)) = current.as_mut() {
                    let (u, g) = rest.split_once(':').unwrap_or((rest, "0"));
                    let parse = |v: &str| {
                        v.parse::<u32>()
                            .map_err(|_| format!("stage {name}: USER {rest} is not numeric"))
                    };
                    decl.user = Some((parse(u)?, parse(g)?));
                }
            }
            _ => {}
        }
    }
    stages.extend(current);
    Ok(stages)
}

/// How the agent turns an image into a program.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    /// `REPOSITORY_SUFFIX=PATH` mappings, checked first.
    pub overrides: Vec<(String, PathBuf)>,
    /// Where the workspace's binaries are.
    pub bin_dir: PathBuf,
    /// The stages of deploy/Dockerfile.
    pub declared: BTreeMap<String, ImageDecl>,
}

/// An image resolved to a local binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub program: PathBuf,
    /// The image's USER, the default when the pod sets no runAsUser.
    pub user: Option<(u32, u32)>,
}

impl Catalog {
    /// The binary an image runs, if any.
    pub fn resolve(&self, image: &str) -> Option<Resolved> {
        let repo = repository(image);
        let name = repo.rsplit('/').next().filter(|n| !n.is_empty())?;
        if let Some(decl) = self.declared.get(name) {
            let entry = Path::new(decl.entrypoint.first()?).file_name()?;
            let program = resolve(image, &self.overrides, &self.bin_dir)
                .filter(|p| p.file_name() == Some(entry))
                .unwrap_or_else(|| self.bin_dir.join(entry));
            return program.is_file().then_some(Resolved {
                program,
                user: decl.user,
            });
        }
        resolve(image, &self.overrides, &self.bin_dir).map(|program| Resolved {
            program,
            user: None,
        })
    }
}

/// The repository part of an image reference: no tag, no digest.
pub fn repository(image: &str) -> &str {
    let no_digest = image.split('@').next().unwrap_or(image);
    // A ':' after the last '/' starts the tag; one before it belongs to a registry port.
    match no_digest.rfind(':') {
        Some(colon) if !no_digest[colon..].contains('/') => &no_digest[..colon],
        _ => no_digest,
    }
}

/// The binary an image maps to, if any.
pub fn resolve(image: &str, overrides: &[(String, PathBuf)], bin_dir: &Path) -> Option<PathBuf> {
    let repo = repository(image);
    if let Some((_, path)) = overrides
        .iter()
        .find(|(suffix, _)| repo.ends_with(suffix.as_str()))
    {
        return Some(path.clone());
    }
    let name = repo.rsplit('/').next().filter(|n| !n.is_empty())?;
    let candidate = bin_dir.join(name);
    candidate.is_file().then_some(candidate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_strips_tag_and_digest_but_not_registry_port() {
        assert_eq!(
            repository("ghcr.io/ferry-dev/ferry-mover:v1"),
            "ghcr.io/ferry-dev/ferry-mover"
        );
        assert_eq!(
            repository("localhost:5000/ferry-mover"),
            "localhost:5000/ferry-mover"
        );
        assert_eq!(repository("ferry-mover@sha256:abc"), "ferry-mover");
        assert_eq!(repository("busybox"), "busybox");
    }

    #[test]
    fn dockerfile_stages_declare_entrypoint_and_user() {
        let text = "ARG X=1\nFROM rust:1 AS build\nRUN a \\\n  && b\n\
                    FROM base:nonroot AS ferry-mover\nUSER 65532:65532\n\
                    ENTRYPOINT [\"/usr/local/bin/ferry-mover\"]\n\
                    FROM base AS tool\nUSER 10\n";
        let stages = parse_dockerfile(text).unwrap();
        assert_eq!(
            stages["ferry-mover"],
            ImageDecl {
                entrypoint: vec!["/usr/local/bin/ferry-mover".into()],
                user: Some((65532, 65532)),
            }
        );
        assert_eq!(stages["tool"].user, Some((10, 0)));
        assert!(stages["build"].entrypoint.is_empty());
        assert!(parse_dockerfile("FROM x AS y\nUSER nobody\n").is_err());
        assert!(parse_dockerfile("FROM x AS y\nENTRYPOINT /bin/sh -c x\n").is_err());
    }

    /// ferry's own Dockerfile declares both images, non-root, with entrypoints the workspace
    /// builds.
    #[test]
    fn the_repository_dockerfile_declares_both_images_non_root() {
        let text = include_str!("../../../deploy/Dockerfile");
        let stages = parse_dockerfile(text).unwrap();
        for image in ["ferry-operator", "ferry-mover"] {
            let decl = &stages[image];
            assert_eq!(decl.entrypoint, vec![format!("/usr/local/bin/{image}")]);
            let (uid, gid) = decl.user.expect("USER");
            assert!(uid != 0 && gid != 0, "{image} runs as root");
        }
    }

    #[test]
    fn declared_images_run_their_entrypoint_as_their_user() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ferry-mover"), b"").unwrap();
        let catalog = Catalog {
            overrides: vec![],
            bin_dir: dir.path().into(),
            declared: parse_dockerfile(
                "FROM b AS ferry-mover\nUSER 7:8\nENTRYPOINT [\"/x/ferry-mover\"]\n\
                 FROM b AS ferry-operator\nENTRYPOINT [\"/x/ferry-operator\"]\n",
            )
            .unwrap(),
        };
        assert_eq!(
            catalog.resolve("r.io/ferry-mover:dev"),
            Some(Resolved {
                program: dir.path().join("ferry-mover"),
                user: Some((7, 8)),
            })
        );
        // Declared, but its entrypoint was not built: no silent fallback.
        assert_eq!(catalog.resolve("r.io/ferry-operator:dev"), None);
    }

    #[test]
    fn resolve_prefers_overrides_then_bin_dir_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ferry-mover"), b"").unwrap();
        assert_eq!(
            resolve("x.io/ferry/ferry-mover:dev", &[], dir.path()),
            Some(dir.path().join("ferry-mover"))
        );
        assert_eq!(resolve("busybox:1", &[], dir.path()), None);
        let over = vec![("ferry-mover".to_string(), PathBuf::from("/opt/m"))];
        assert_eq!(
            resolve("ferry-mover", &over, dir.path()),
            Some(PathBuf::from("/opt/m"))
        );
    }
}
