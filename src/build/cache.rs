//! The object cache: which compiled object belongs to which source, and when the library must be
//! relinked.
//!
//! An object is named after its source and a hash of everything that determines its bytes (the
//! compiler's fingerprint, the source, the generated headers it includes), so "is it cached?" is
//! a file-existence check and no index file can go out of sync with the objects. The library's
//! stamp records the exact object set of the last link: the object names carry their hashes, so
//! equal names mean an equal link.

use sha2::{Digest, Sha256};
use std::path::{Component, Path};

/// Hex digits of the content hash kept in object names: 64 bits, far beyond any collision risk
/// among the few hundred objects of a model, and short enough to keep names readable.
pub const HASH_DIGITS: usize = 16;

/// Bumped when the hashing scheme changes, so old objects never match new keys.
const SCHEME: &[u8] = b"onnx2ait-build-v2";

/// A generated header: its name (relative to the output directory) and bytes.
pub struct Header {
    pub name: String,
    pub bytes: Vec<u8>,
}

/// The content hash of one source's object, as lowercase hex (64 digits).
///
/// Every part is length-prefixed, so no two different inputs serialise to the same byte stream.
pub fn object_hash(fingerprint: &str, source: &[u8], headers: &[&Header]) -> String {
    let mut h = Sha256::new();
    h.update(SCHEME);
    feed(&mut h, fingerprint.as_bytes());
    feed(&mut h, source);
    h.update((headers.len() as u64).to_le_bytes());
    for header in headers {
        feed(&mut h, header.name.as_bytes());
        feed(&mut h, &header.bytes);
    }
    hex(&h.finalize())
}

/// The headers among `headers` that `source` includes, directly or through another of them
/// (`#include "name"` lines), in the order of `headers`. Only these feed a source's hash, so a
/// library instance that includes nothing model-specific keeps its object across models and
/// across the profiler's and the model's builds.
pub fn included<'a>(source: &[u8], headers: &'a [Header]) -> Vec<&'a Header> {
    fn quoted_includes(text: &[u8]) -> impl Iterator<Item = String> + '_ {
        text.split(|&b| b == b'\n').filter_map(|line| {
            let line = String::from_utf8_lossy(line);
            let rest = line.trim_start().strip_prefix('#')?.trim_start().strip_prefix("include")?.trim_start();
            let rest = rest.strip_prefix('"')?;
            Some(rest[..rest.find('"')?].to_string())
        })
    }
    let mut used = vec![false; headers.len()];
    let mut stack: Vec<String> = quoted_includes(source).collect();
    while let Some(name) = stack.pop() {
        if let Some(i) = headers.iter().position(|h| h.name == name) {
            if !used[i] {
                used[i] = true;
                stack.extend(quoted_includes(&headers[i].bytes));
            }
        }
    }
    headers.iter().zip(used).filter(|(_, u)| *u).map(|(h, _)| h).collect()
}

fn feed(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The base of a source's object names: its path relative to the output directory without the
/// extension, folders joined with `__`, so `k012_conv2d_library.cu` → `k012_conv2d_library` and
/// sources of the same name in different folders do not collide. Characters that are awkward in
/// file names or compiler command lines become `_`.
pub fn object_base(rel: &Path) -> Option<String> {
    let mut parts: Vec<String> = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
            Component::CurDir => {}
            // Absolute paths and `..` were resolved by the caller; anything else has no stable name.
            _ => return None,
        }
    }
    let last = parts.pop()?;
    let stem = match last.rfind('.') {
        Some(i) if i > 0 => last[..i].to_string(),
        _ => last,
    };
    parts.push(stem);
    let joined = parts.join("__");
    let clean: String =
        joined.chars().map(|c| if c.is_ascii_alphanumeric() || "_-+.".contains(c) { c } else { '_' }).collect();
    if clean.is_empty() {
        None
    } else {
        Some(clean)
    }
}

/// `<base>-<hash16>.<ext>`.
pub fn object_name(base: &str, hash: &str, ext: &str) -> String {
    let short = &hash[..HASH_DIGITS.min(hash.len())];
    format!("{base}-{short}.{ext}")
}

/// True when `name` is an object of `base` under some hash (`<base>-<16 hex>.<ext>`). A different
/// source whose base merely starts with `base-` never matches: its remainder is not 16 hex digits.
pub fn is_object_of(name: &str, base: &str, ext: &str) -> bool {
    let Some(rest) = name.strip_prefix(base).and_then(|r| r.strip_prefix('-')) else {
        return false;
    };
    let Some(hash) = rest.strip_suffix(ext).and_then(|r| r.strip_suffix('.')) else {
        return false;
    };
    hash.len() == HASH_DIGITS && hash.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The hash digits in an object's name (`<base>-<16 hex>.<ext>`); `None` for other names.
pub fn hash_in_name<'a>(name: &'a str, ext: &str) -> Option<&'a str> {
    let stem = name.strip_suffix(ext)?.strip_suffix('.')?;
    let (base, hash) = stem.rsplit_once('-')?;
    let hex = hash.len() == HASH_DIGITS && hash.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    (hex && !base.is_empty()).then_some(hash)
}

/// The stamp of a link: the compiler's fingerprint (link flags included) and the object names in
/// link order. The library is relinked whenever the stamp on disk differs.
pub fn link_stamp(fingerprint: &str, lib_name: &str, objects: &[String]) -> String {
    let mut s = String::new();
    s.push_str("# onnx2ait link stamp: the library is relinked when this changes\n");
    s.push_str(&format!("library {lib_name}\n"));
    let mut h = Sha256::new();
    h.update(SCHEME);
    feed(&mut h, fingerprint.as_bytes());
    s.push_str(&format!("compiler {}\n", hex(&h.finalize())));
    for o in objects {
        s.push_str(&format!("object {o}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn hash_depends_on_every_input() {
        let hdr = |n: &str, b: &str| Header { name: n.into(), bytes: b.as_bytes().to_vec() };
        let base = object_hash("nvcc 13", b"src", &[&hdr("common.cuh", "x")]);
        assert_eq!(base.len(), 64);
        assert_eq!(base, object_hash("nvcc 13", b"src", &[&hdr("common.cuh", "x")]));
        assert_ne!(base, object_hash("nvcc 12", b"src", &[&hdr("common.cuh", "x")]));
        assert_ne!(base, object_hash("nvcc 13", b"src2", &[&hdr("common.cuh", "x")]));
        assert_ne!(base, object_hash("nvcc 13", b"src", &[&hdr("common.cuh", "y")]));
        assert_ne!(base, object_hash("nvcc 13", b"src", &[&hdr("other.cuh", "x")]));
        assert_ne!(base, object_hash("nvcc 13", b"src", &[]));
        // Moving bytes between fields must change the hash (length prefixes).
        assert_ne!(object_hash("ab", b"c", &[]), object_hash("a", b"bc", &[]));
    }

    #[test]
    fn only_included_headers_count() {
        let hdr = |n: &str, b: &str| Header { name: n.into(), bytes: b.as_bytes().to_vec() };
        let headers = [
            hdr("library.cuh", "#pragma once\n"),
            hdr("common.cuh", "#pragma once\n  #  include \"library.cuh\"\n"),
            hdr("kernels.h", "#include \"common.cuh\"\n"),
        ];
        let names =
            |src: &str| -> Vec<String> { included(src.as_bytes(), &headers).iter().map(|h| h.name.clone()).collect() };
        assert_eq!(names("#include \"library.cuh\"\n#include \"cutlass/cutlass.h\"\n"), ["library.cuh"]);
        assert_eq!(names("#include \"common.cuh\"\n"), ["library.cuh", "common.cuh"]);
        assert_eq!(names("#include \"kernels.h\"\n"), ["library.cuh", "common.cuh", "kernels.h"]);
        assert!(names("#include <cuda_runtime.h>\nint x;\n").is_empty());
    }

    #[test]
    fn bases_and_names() {
        assert_eq!(object_base(Path::new("k012_conv2d_library.cu")).as_deref(), Some("k012_conv2d_library"));
        assert_eq!(object_base(Path::new("./model.cu")).as_deref(), Some("model"));
        assert_eq!(object_base(Path::new("sub/dir/k 1.cu")).as_deref(), Some("sub__dir__k_1"));
        assert_eq!(object_base(Path::new(".hidden")).as_deref(), Some(".hidden"));
        assert_eq!(object_base(Path::new("../x.cu")), None);
        assert_eq!(object_base(&PathBuf::from("/abs/x.cu")), None);
        assert_eq!(object_base(Path::new("")), None);

        let h = "0123456789abcdef0123";
        let name = object_name("k001", h, "o");
        assert_eq!(name, "k001-0123456789abcdef.o");
        assert!(is_object_of(&name, "k001", "o"));
        assert!(!is_object_of(&name, "k00", "o"));
        assert!(!is_object_of(&name, "k001", "obj"));
        assert!(!is_object_of("k001-extra-0123456789abcdef.o", "k001", "o"));
        assert!(!is_object_of("k001-0123456789ABCDEF.o", "k001", "o"));
        assert!(!is_object_of("k001-0123456789abcdef.o.tmp1.o", "k001", "o"));
        assert_eq!(hash_in_name(&name, "o"), Some("0123456789abcdef"));
        assert_eq!(hash_in_name("a-b-0123456789abcdef.o", "o"), Some("0123456789abcdef"));
        assert_eq!(hash_in_name("k001-0123456789abcdef.obj", "o"), None);
        assert_eq!(hash_in_name("k001-0123456789abcde.o", "o"), None);
        assert_eq!(hash_in_name("-0123456789abcdef.o", "o"), None);
    }

    #[test]
    fn stamp_changes_with_objects_and_compiler() {
        let objs = vec!["a-1.o".to_string(), "b-2.o".to_string()];
        let s = link_stamp("f", "libmodel.so", &objs);
        assert!(s.contains("object a-1.o\nobject b-2.o\n"), "{s}");
        assert_ne!(s, link_stamp("g", "libmodel.so", &objs));
        assert_ne!(s, link_stamp("f", "libmodel.so", &objs[..1]));
    }
}
