//! `TensorProto` → `ir::Tensor`: raw little-endian data, typed fields, and external data files.

use super::proto::TensorProto;
use crate::ir::{DType, Elem, Tensor};
use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};
use std::path::{Component, Path};

/// Decodes a tensor. `base_dir` is the model's folder, against which external data locations
/// are resolved. Errors say what is wrong; the caller names the tensor and file.
pub fn tensor_from_proto(t: &TensorProto, base_dir: &Path) -> Result<Tensor, String> {
    let code = t.data_type.unwrap_or(0);
    let dtype = DType::from_onnx(code)
        .ok_or_else(|| format!("data type {} ({code}) is not supported", DType::onnx_code_name(code)))?;
    if t.segment.is_some() {
        return Err("segmented tensors are not supported".into());
    }
    let mut shape = Vec::with_capacity(t.dims.len());
    for &d in &t.dims {
        if d < 0 {
            return Err(format!("negative dimension {d} in dims {:?}", t.dims));
        }
        shape.push(d as usize);
    }
    let count = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("dims {:?} overflow", t.dims))?;

    let external = t.data_location == Some(1);
    if external {
        let need = count.checked_mul(dtype.size_bytes()).ok_or_else(|| format!("dims {:?} overflow", t.dims))?;
        let bytes = read_external(t, base_dir, need)?;
        return from_le_bytes(dtype, &shape, count, &bytes);
    }
    if let Some(raw) = &t.raw_data {
        return from_le_bytes(dtype, &shape, count, raw);
    }
    from_typed_fields(t, dtype, &shape, count)
}

fn read_external(t: &TensorProto, base_dir: &Path, expected: usize) -> Result<Vec<u8>, String> {
    let mut location = None;
    let mut offset = 0u64;
    let mut length: Option<u64> = None;
    for kv in &t.external_data {
        let key = kv.key.as_deref().unwrap_or("");
        let value = kv.value.as_deref().unwrap_or("");
        match key {
            "location" => location = Some(value.to_string()),
            "offset" => {
                offset = value.parse().map_err(|_| format!("external data offset '{value}' is not a number"))?
            }
            "length" => {
                length = Some(value.parse().map_err(|_| format!("external data length '{value}' is not a number"))?)
            }
            _ => {}
        }
    }
    let location = location.ok_or("external data has no 'location'")?;
    let rel = Path::new(&location);
    // Locations are relative to the model's folder and may not escape it (as ONNX Runtime checks).
    if rel.is_absolute() || rel.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(format!("external data location '{location}' must be a relative path inside the model's folder"));
    }
    let path = base_dir.join(rel);
    let file =
        std::fs::File::open(&path).map_err(|e| format!("cannot open external data file '{}': {e}", path.display()))?;
    let file_len = file.metadata().map_err(|e| format!("'{}': {e}", path.display()))?.len();
    let length = length.unwrap_or(file_len.saturating_sub(offset));
    if offset.checked_add(length).is_none_or(|end| end > file_len) {
        return Err(format!(
            "external data range offset {offset} + length {length} is past the end of '{}' ({file_len} bytes)",
            path.display()
        ));
    }
    if length as usize != expected {
        return Err(format!("external data length {length} does not match the tensor's {expected} bytes"));
    }
    // SAFETY: the file is opened read-only and only read during this call; a concurrent writer
    // truncating the file is outside what an importer can defend against.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| format!("cannot map '{}': {e}", path.display()))?;
    Ok(map[offset as usize..(offset + length) as usize].to_vec())
}

fn array<T: Elem>(shape: &[usize], v: Vec<T>) -> Result<Tensor, String> {
    ArrayD::from_shape_vec(IxDyn(shape), v).map(T::wrap).map_err(|e| format!("bad tensor layout: {e}"))
}

fn from_le_bytes(dtype: DType, shape: &[usize], count: usize, raw: &[u8]) -> Result<Tensor, String> {
    let need = count.checked_mul(dtype.size_bytes()).ok_or_else(|| format!("{count} elements overflow"))?;
    if raw.len() != need {
        return Err(format!("raw data has {} bytes, but {count} {} elements need {need}", raw.len(), dtype.name()));
    }
    macro_rules! le {
        ($t:ty, $n:literal) => {
            array::<$t>(shape, raw.chunks_exact($n).map(|c| <$t>::from_le_bytes(c.try_into().unwrap())).collect())
        };
    }
    match dtype {
        DType::F32 => le!(f32, 4),
        DType::F64 => le!(f64, 8),
        DType::I8 => le!(i8, 1),
        DType::I16 => le!(i16, 2),
        DType::I32 => le!(i32, 4),
        DType::I64 => le!(i64, 8),
        DType::U8 => le!(u8, 1),
        DType::U16 => le!(u16, 2),
        DType::U32 => le!(u32, 4),
        DType::U64 => le!(u64, 8),
        DType::F16 => array(shape, raw.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]])).collect()),
        DType::BF16 => array(shape, raw.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]])).collect()),
        DType::Bool => array(shape, raw.iter().map(|&b| b != 0).collect()),
    }
}

fn from_typed_fields(t: &TensorProto, dtype: DType, shape: &[usize], count: usize) -> Result<Tensor, String> {
    let check = |n: usize, field: &str| {
        if n == count {
            Ok(())
        } else {
            Err(format!("{field} has {n} values, but dims {shape:?} need {count}"))
        }
    };
    match dtype {
        DType::F32 => {
            check(t.float_data.len(), "float_data")?;
            array(shape, t.float_data.clone())
        }
        DType::F64 => {
            check(t.double_data.len(), "double_data")?;
            array(shape, t.double_data.clone())
        }
        DType::I64 => {
            check(t.int64_data.len(), "int64_data")?;
            array(shape, t.int64_data.clone())
        }
        DType::U32 | DType::U64 => {
            check(t.uint64_data.len(), "uint64_data")?;
            let v = t.uint64_data.clone();
            if dtype == DType::U64 {
                array(shape, v)
            } else {
                array::<u32>(shape, v.into_iter().map(|x| x as u32).collect())
            }
        }
        _ => {
            // int32_data carries every type of 32 bits or fewer; float16/bfloat16 as their bit patterns.
            check(t.int32_data.len(), "int32_data")?;
            let v = &t.int32_data;
            match dtype {
                DType::I32 => array(shape, v.clone()),
                DType::I16 => array::<i16>(shape, v.iter().map(|&x| x as i16).collect()),
                DType::I8 => array::<i8>(shape, v.iter().map(|&x| x as i8).collect()),
                DType::U16 => array::<u16>(shape, v.iter().map(|&x| x as u16).collect()),
                DType::U8 => array::<u8>(shape, v.iter().map(|&x| x as u8).collect()),
                DType::Bool => array::<bool>(shape, v.iter().map(|&x| x != 0).collect()),
                DType::F16 => array(shape, v.iter().map(|&x| f16::from_bits(x as u16)).collect()),
                DType::BF16 => array(shape, v.iter().map(|&x| bf16::from_bits(x as u16)).collect()),
                _ => unreachable!("all other dtypes handled above"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proto(dtype: DType, dims: Vec<i64>) -> TensorProto {
        TensorProto { data_type: Some(dtype.onnx_code()), dims, ..Default::default() }
    }

    #[test]
    fn raw_and_typed_fields_agree() {
        let mut a = proto(DType::F32, vec![2]);
        a.raw_data = Some([1.5f32, -2.0].iter().flat_map(|v| v.to_le_bytes()).collect());
        let mut b = proto(DType::F32, vec![2]);
        b.float_data = vec![1.5, -2.0];
        assert_eq!(tensor_from_proto(&a, Path::new(".")).unwrap(), tensor_from_proto(&b, Path::new(".")).unwrap());
    }

    #[test]
    fn half_types_via_int32_data() {
        let mut t = proto(DType::F16, vec![2]);
        t.int32_data = vec![f16::from_f32(0.5).to_bits() as i32, f16::from_f32(-3.0).to_bits() as i32];
        let got = tensor_from_proto(&t, Path::new(".")).unwrap();
        assert_eq!(got.to_f64_vec(), vec![0.5, -3.0]);
        let mut b = proto(DType::BF16, vec![1]);
        b.int32_data = vec![bf16::from_f32(2.0).to_bits() as i32];
        assert_eq!(tensor_from_proto(&b, Path::new(".")).unwrap().to_f64_vec(), vec![2.0]);
    }

    #[test]
    fn size_mismatch_is_an_error() {
        let mut t = proto(DType::I64, vec![3]);
        t.int64_data = vec![1, 2];
        let e = tensor_from_proto(&t, Path::new(".")).unwrap_err();
        assert!(e.contains("int64_data has 2 values"), "{e}");
        let mut r = proto(DType::F32, vec![2]);
        r.raw_data = Some(vec![0; 7]);
        assert!(tensor_from_proto(&r, Path::new(".")).unwrap_err().contains("raw data has 7 bytes"));
    }

    #[test]
    fn external_data_is_read_relative_to_the_model() {
        let dir = std::env::temp_dir().join(format!("onnx2ait-ext-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let data: Vec<u8> = [0u8; 8].iter().copied().chain([7f32, 8.0].iter().flat_map(|v| v.to_le_bytes())).collect();
        std::fs::write(dir.join("w.bin"), data).unwrap();
        let mut t = proto(DType::F32, vec![2]);
        t.data_location = Some(1);
        let kv = |k: &str, v: &str| super::super::proto::StringStringEntryProto {
            key: Some(k.into()),
            value: Some(v.into()),
        };
        t.external_data = vec![kv("location", "w.bin"), kv("offset", "8"), kv("length", "8")];
        assert_eq!(tensor_from_proto(&t, &dir).unwrap().to_f64_vec(), vec![7.0, 8.0]);
        t.external_data[0] = kv("location", "../w.bin");
        assert!(tensor_from_proto(&t, &dir).unwrap_err().contains("inside the model's folder"));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn unsupported_dtype_is_named() {
        let t = proto(DType::F32, vec![1]);
        let s = TensorProto { data_type: Some(8), ..t };
        assert!(tensor_from_proto(&s, Path::new(".")).unwrap_err().contains("STRING"));
    }
}
