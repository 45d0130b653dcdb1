//! The public API of the `distlock` crate as text, one line per item, from rustdoc's JSON
//! output: what `docs/api.txt` holds, so that a change to the public surface is a visible
//! diff. rustdoc writes JSON behind `-Z unstable-options`; `RUSTC_BOOTSTRAP=1` lets the
//! pinned stable toolchain do it, and the output is read with the format of that toolchain.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The features docs.rs documents, as `[package.metadata.docs.rs]` of the crate lists them:
/// the API.
fn features() -> Result<String, String> {
    let manifest = workspace_root().join("crates/distlock/Cargo.toml");
    let text =
        std::fs::read_to_string(&manifest).map_err(|e| format!("reading {manifest:?}: {e}"))?;
    let section = text
        .split("[package.metadata.docs.rs]")
        .nth(1)
        .ok_or("no [package.metadata.docs.rs] in crates/distlock/Cargo.toml")?;
    let line = section
        .lines()
        .take_while(|line| !line.starts_with('['))
        .find(|line| line.starts_with("features"))
        .ok_or("no features = [...] under [package.metadata.docs.rs]")?;
    let list = line
        .split_once('=')
        .map(|(_, list)| list)
        .unwrap_or_default();
    Ok(list
        .trim()
        .trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .map(|feature| feature.trim().trim_matches('"'))
        .filter(|feature| !feature.is_empty())
        .collect::<Vec<_>>()
        .join(","))
}

/// Where the committed listing lives.
pub fn api_file() -> PathBuf {
    workspace_root().join("docs/api.txt")
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The listing of the crate as it is now: rustdoc's JSON made in `target_dir`, then read.
pub fn current(target_dir: &Path) -> Result<String, String> {
    let features = features()?;
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
        .current_dir(workspace_root())
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_TARGET_DIR", target_dir)
        .args([
            "rustdoc",
            "--locked",
            "-p",
            "distlock",
            "--lib",
            "--features",
            &features,
        ])
        .args(["--", "-Z", "unstable-options", "--output-format", "json"])
        .status()
        .map_err(|e| format!("running cargo rustdoc: {e}"))?;
    if !status.success() {
        return Err(format!("cargo rustdoc failed: {status}"));
    }
    let json = target_dir.join("doc/distlock.json");
    let text = std::fs::read_to_string(&json).map_err(|e| format!("reading {json:?}: {e}"))?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| format!("parsing {json:?}: {e}"))?;
    listing(&doc, &features)
}

/// One line per public item reachable from the crate root, sorted.
pub fn listing(doc: &Value, features: &str) -> Result<String, String> {
    let root = doc["root"]
        .as_u64()
        .map(|id| id.to_string())
        .or_else(|| doc["root"].as_str().map(str::to_owned))
        .ok_or("rustdoc JSON without a root")?;
    let mut lister = Lister {
        index: &doc["index"],
        lines: BTreeSet::new(),
        seen: BTreeSet::new(),
    };
    lister.module(&root, "distlock");
    let mut out = format!(
        "# The public API of distlock (features {features}), from rustdoc's JSON.\n\
         # Regenerate with `cargo run -p xtask -- public-api`; a test fails when it differs.\n"
    );
    for line in lister.lines {
        out.push_str(&line);
        out.push('\n');
    }
    Ok(out)
}

struct Lister<'a> {
    index: &'a Value,
    lines: BTreeSet<String>,
    /// Modules already walked (a module re-exported twice is listed at its first path).
    seen: BTreeSet<String>,
}

/// An id as the index keys it (a number in newer formats, a string in older ones).
fn key(id: &Value) -> Option<String> {
    id.as_u64()
        .map(|n| n.to_string())
        .or_else(|| id.as_str().map(str::to_owned))
}

/// The one key of an `inner` object (`"function"`, `"struct"` ...) and its value.
fn inner(item: &Value) -> Option<(&str, &Value)> {
    item["inner"]
        .as_object()
        .and_then(|inner| inner.iter().next())
        .map(|(kind, value)| (kind.as_str(), value))
}

impl Lister<'_> {
    fn item(&self, id: &str) -> Option<&Value> {
        self.index.get(id)
    }

    fn module(&mut self, id: &str, path: &str) {
        if !self.seen.insert(id.to_owned()) {
            return;
        }
        let Some(module) = self.item(id) else { return };
        let items: Vec<String> = module["inner"]["module"]["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(key)
            .collect();
        for child in items {
            self.entry(&child, path);
        }
    }

    /// A public item of the module at `path`.
    fn entry(&mut self, id: &str, path: &str) {
        let Some(item) = self.item(id).cloned() else {
            return;
        };
        if item["visibility"] != "public" {
            return;
        }
        let Some((kind, value)) = inner(&item) else {
            return;
        };
        if kind == "use" {
            let name = value["name"].as_str().unwrap_or("?");
            let target = value["id"]
                .as_u64()
                .map(|n| n.to_string())
                .or_else(|| value["id"].as_str().map(str::to_owned));
            match target {
                Some(target) if self.item(&target).is_some() => {
                    if value["is_glob"].as_bool() == Some(true) {
                        self.module(&target, path);
                    } else {
                        self.named(&target, &format!("{path}::{name}"));
                    }
                }
                // An item of another crate, re-exported.
                _ => {
                    self.lines.insert(format!(
                        "pub use {path}::{name} = {}",
                        value["source"].as_str().unwrap_or("?")
                    ));
                }
            }
            return;
        }
        let name = item["name"].as_str().unwrap_or("?");
        self.named(id, &format!("{path}::{name}"));
    }

    /// The item `id`, listed as `path`, with its members.
    fn named(&mut self, id: &str, path: &str) {
        let Some(item) = self.item(id).cloned() else {
            return;
        };
        let Some((kind, value)) = inner(&item) else {
            return;
        };
        match kind {
            "module" => {
                self.lines.insert(format!("pub mod {path}"));
                self.module(id, path);
            }
            "function" => {
                self.lines.insert(fn_line(path, value));
            }
            "constant" => {
                self.lines
                    .insert(format!("pub const {path}: {}", ty(&value["type"])));
            }
            "static" => {
                self.lines
                    .insert(format!("pub static {path}: {}", ty(&value["type"])));
            }
            "type_alias" => {
                self.lines
                    .insert(format!("pub type {path} = {}", ty(&value["type"])));
            }
            "macro" | "proc_macro" => {
                self.lines.insert(format!("pub macro {path}"));
            }
            "struct" | "union" => {
                let generics = generics(&value["generics"]);
                let fields = if kind == "union" {
                    &value["fields"]
                } else {
                    &value["kind"]["plain"]["fields"]
                };
                let tuple = self.fields(&value["kind"]["tuple"], true);
                self.lines
                    .insert(format!("pub {kind} {path}{generics}{tuple}"));
                for field in fields.as_array().into_iter().flatten().filter_map(key) {
                    if let Some(field) = self.item(&field).cloned()
                        && field["visibility"] == "public"
                    {
                        self.lines.insert(format!(
                            "pub field {path}::{}: {}",
                            field["name"].as_str().unwrap_or("?"),
                            ty(&field["inner"]["struct_field"])
                        ));
                    }
                }
                self.impls(value, path);
            }
            "enum" => {
                self.lines
                    .insert(format!("pub enum {path}{}", generics(&value["generics"])));
                let variants: Vec<String> = value["variants"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(key)
                    .collect();
                for variant in variants {
                    let Some(variant) = self.item(&variant).cloned() else {
                        continue;
                    };
                    let name = variant["name"].as_str().unwrap_or("?");
                    let kind = &variant["inner"]["variant"]["kind"];
                    let fields = if let Some(tuple) = kind.get("tuple") {
                        self.fields(tuple, true)
                    } else if let Some(named) = kind.get("struct") {
                        self.fields(&named["fields"], false)
                    } else {
                        String::new()
                    };
                    self.lines
                        .insert(format!("pub variant {path}::{name}{fields}"));
                }
                self.impls(value, path);
            }
            "trait" => {
                let supertraits = bounds(&value["bounds"]);
                let colon = if supertraits.is_empty() { "" } else { ": " };
                self.lines.insert(format!(
                    "pub trait {path}{}{colon}{supertraits}",
                    generics(&value["generics"])
                ));
                let items: Vec<String> = value["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(key)
                    .collect();
                for member in items {
                    self.member(&member, path, true);
                }
            }
            other => {
                self.lines.insert(format!("pub {other} {path}"));
            }
        }
    }

    /// ` { a: A, b: B }` or `(A, B)` of fields given by id (`None` for a hidden tuple field).
    fn fields(&self, ids: &Value, tuple: bool) -> String {
        let Some(ids) = ids.as_array() else {
            return String::new();
        };
        let parts: Vec<String> = ids
            .iter()
            .map(|id| match key(id).and_then(|id| self.item(&id)) {
                Some(field) if tuple => ty(&field["inner"]["struct_field"]),
                Some(field) => format!(
                    "{}: {}",
                    field["name"].as_str().unwrap_or("?"),
                    ty(&field["inner"]["struct_field"])
                ),
                None => "_".to_owned(),
            })
            .collect();
        if tuple {
            format!("({})", parts.join(", "))
        } else {
            format!(" {{ {} }}", parts.join(", "))
        }
    }

    /// The inherent members and the (written, not automatic or blanket) trait impls of a type.
    fn impls(&mut self, value: &Value, path: &str) {
        let impls: Vec<String> = value["impls"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(key)
            .collect();
        for id in impls {
            let Some(imp) = self.item(&id).cloned() else {
                continue;
            };
            let imp = &imp["inner"]["impl"];
            if imp["is_synthetic"].as_bool() == Some(true) || !imp["blanket_impl"].is_null() {
                continue;
            }
            if imp["trait"].is_null() {
                let members: Vec<String> = imp["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(key)
                    .collect();
                for member in members {
                    if self
                        .item(&member)
                        .is_some_and(|m| m["visibility"] == "public")
                    {
                        self.member(&member, path, false);
                    }
                }
            } else {
                let name = imp["trait"]["path"].as_str().unwrap_or("?");
                // The trait by its last segment (`fmt::Debug` and `Debug` are one trait).
                let name = name.rsplit("::").next().unwrap_or(name);
                self.lines.insert(format!(
                    "impl{} {name}{} for {}",
                    generics(&imp["generics"]),
                    args(&imp["trait"]["args"]),
                    path
                ));
            }
        }
    }

    /// An associated item of the type or trait at `path`.
    fn member(&mut self, id: &str, path: &str, in_trait: bool) {
        let Some(item) = self.item(id).cloned() else {
            return;
        };
        let name = item["name"].as_str().unwrap_or("?");
        let Some((kind, value)) = inner(&item) else {
            return;
        };
        let line = match kind {
            "function" if in_trait && value["has_body"].as_bool() == Some(true) => {
                fn_line(&format!("{path}::{name}"), value) + " (provided)"
            }
            "function" => fn_line(&format!("{path}::{name}"), value),
            "assoc_const" => format!("pub const {path}::{name}: {}", ty(&value["type"])),
            "assoc_type" => format!("pub type {path}::{name}"),
            other => format!("pub {other} {path}::{name}"),
        };
        self.lines.insert(line);
    }
}

/// `<T: Bound, 'a> where ...` of an item's generics, without the parameters of `impl Trait`
/// arguments; nothing when there are none.
fn generics(value: &Value) -> String {
    let (params, predicates) = generic_parts(value);
    params + &predicates
}

/// The `<...>` and the ` where ...` of an item's generics, each empty when there is none.
fn generic_parts(value: &Value) -> (String, String) {
    let params: Vec<String> = value["params"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|param| {
            let name = param["name"].as_str().unwrap_or("?");
            let kind = &param["kind"];
            if let Some(ty_param) = kind.get("type") {
                if ty_param["is_synthetic"].as_bool() == Some(true) {
                    return None;
                }
                let bounds = bounds(&ty_param["bounds"]);
                Some(if bounds.is_empty() {
                    name.to_owned()
                } else {
                    format!("{name}: {bounds}")
                })
            } else if let Some(constant) = kind.get("const") {
                Some(format!("const {name}: {}", ty(&constant["type"])))
            } else {
                Some(name.to_owned())
            }
        })
        .collect();
    let predicates: Vec<String> = value["where_predicates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|predicate| {
            let bound = predicate.get("bound_predicate")?;
            Some(format!(
                "{}: {}",
                ty(&bound["type"]),
                bounds(&bound["bounds"])
            ))
        })
        .collect();
    let params = if params.is_empty() {
        String::new()
    } else {
        format!("<{}>", params.join(", "))
    };
    let predicates = if predicates.is_empty() {
        String::new()
    } else {
        format!(" where {}", predicates.join(", "))
    };
    (params, predicates)
}

/// `pub async fn path<generics>(arg: Type, ...) -> Output where ...`.
fn fn_line(path: &str, function: &Value) -> String {
    let sig = &function["sig"];
    let inputs: Vec<String> = sig["inputs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|input| {
            let name = input[0].as_str().unwrap_or("_");
            let ty = ty(&input[1]);
            if name == "self" {
                match ty.as_str() {
                    "Self" => "self".to_owned(),
                    "&Self" => "&self".to_owned(),
                    "&mut Self" => "&mut self".to_owned(),
                    _ => format!("self: {ty}"),
                }
            } else {
                format!("{name}: {ty}")
            }
        })
        .collect();
    let header = &function["header"];
    let (params, predicates) = generic_parts(&function["generics"]);
    let mut out = "pub ".to_owned();
    if header["is_async"].as_bool() == Some(true) {
        out.push_str("async ");
    }
    if header["is_unsafe"].as_bool() == Some(true) {
        out.push_str("unsafe ");
    }
    out.push_str("fn ");
    out.push_str(path);
    out.push_str(&params);
    out.push('(');
    out.push_str(&inputs.join(", "));
    out.push(')');
    if !sig["output"].is_null() {
        out.push_str(" -> ");
        out.push_str(&ty(&sig["output"]));
    }
    out.push_str(&predicates);
    out
}

/// A type as Rust writes it (paths by their last segments, as rustdoc gives them).
fn ty(value: &Value) -> String {
    let Some((kind, inner)) = value.as_object().and_then(|o| o.iter().next()) else {
        return "?".to_owned();
    };
    match kind.as_str() {
        "primitive" | "generic" => inner.as_str().unwrap_or("?").to_owned(),
        "resolved_path" => format!(
            "{}{}",
            inner["path"].as_str().unwrap_or("?"),
            args(&inner["args"])
        ),
        "borrowed_ref" => {
            let lifetime = inner["lifetime"]
                .as_str()
                .map(|l| format!("{l} "))
                .unwrap_or_default();
            let mutable = if inner["is_mutable"].as_bool() == Some(true) {
                "mut "
            } else {
                ""
            };
            format!("&{lifetime}{mutable}{}", ty(&inner["type"]))
        }
        "raw_pointer" => {
            let mutable = if inner["is_mutable"].as_bool() == Some(true) {
                "mut"
            } else {
                "const"
            };
            format!("*{mutable} {}", ty(&inner["type"]))
        }
        "tuple" => {
            let parts: Vec<String> = inner.as_array().into_iter().flatten().map(ty).collect();
            format!("({})", parts.join(", "))
        }
        "slice" => format!("[{}]", ty(inner)),
        "array" => format!(
            "[{}; {}]",
            ty(&inner["type"]),
            inner["len"].as_str().unwrap_or("?")
        ),
        "impl_trait" => format!("impl {}", bounds(inner)),
        "dyn_trait" => {
            let traits: Vec<String> = inner["traits"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| {
                    format!(
                        "{}{}",
                        t["trait"]["path"].as_str().unwrap_or("?"),
                        args(&t["trait"]["args"])
                    )
                })
                .collect();
            format!("dyn {}", traits.join(" + "))
        }
        "qualified_path" => format!(
            "<{} as {}>::{}",
            ty(&inner["self_type"]),
            inner["trait"]["path"].as_str().unwrap_or("?"),
            inner["name"].as_str().unwrap_or("?")
        ),
        "function_pointer" => "fn(..)".to_owned(),
        other => other.to_owned(),
    }
}

/// `<A, B>` of a path, or nothing.
fn args(value: &Value) -> String {
    let Some(angle) = value.get("angle_bracketed") else {
        return if value.get("parenthesized").is_some() {
            "(..)".to_owned()
        } else {
            String::new()
        };
    };
    let parts: Vec<String> = angle["args"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|arg| match arg.as_object().and_then(|o| o.iter().next()) {
            Some((kind, inner)) if kind == "type" => ty(inner),
            Some((kind, inner)) if kind == "lifetime" => inner.as_str().unwrap_or("'_").to_owned(),
            Some((kind, inner)) if kind == "const" => {
                inner["expr"].as_str().unwrap_or("?").to_owned()
            }
            _ => "?".to_owned(),
        })
        .chain(
            angle["constraints"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    let name = c["name"].as_str().unwrap_or("?");
                    match c["binding"].get("equality").and_then(|e| e.get("type")) {
                        Some(t) => format!("{name} = {}", ty(t)),
                        None => name.to_owned(),
                    }
                }),
        )
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("<{}>", parts.join(", "))
    }
}

/// `A + B + 'a` of a list of generic bounds.
fn bounds(value: &Value) -> String {
    let parts: Vec<String> = value
        .as_array()
        .into_iter()
        .flatten()
        .map(|bound| {
            if let Some(t) = bound.get("trait_bound") {
                format!(
                    "{}{}",
                    t["trait"]["path"].as_str().unwrap_or("?"),
                    args(&t["trait"]["args"])
                )
            } else {
                bound["outlives"].as_str().unwrap_or("?").to_owned()
            }
        })
        .collect();
    parts.join(" + ")
}
