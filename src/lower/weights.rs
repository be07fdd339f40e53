//! The weights blob: every constant a kernel reads, converted to its device dtype and packed
//! little-endian, each tensor at a 256-byte aligned offset (see `program::ALIGN`).

use crate::ir::Tensor;

/// Little-endian bytes of a tensor in logical (row-major) order; booleans as one byte each.
pub fn to_le_bytes(t: &Tensor) -> Vec<u8> {
    let mut out = Vec::with_capacity(t.size_bytes());
    match t {
        Tensor::F32(a) => a.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        Tensor::F64(a) => a.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        Tensor::F16(a) => a.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        Tensor::BF16(a) => a.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        Tensor::I8(a) => a.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        Tensor::I16(a) => a.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        Tensor::I32(a) => a.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        Tensor::I64(a) => a.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        Tensor::U8(a) => out.extend(a.iter().copied()),
        Tensor::U16(a) => a.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        Tensor::U32(a) => a.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        Tensor::U64(a) => a.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        Tensor::Bool(a) => out.extend(a.iter().map(|&b| b as u8)),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_and_bool_bytes() {
        let t = Tensor::F32(ndarray::arr1(&[1.0f32, -2.0]).into_dyn()).cast(crate::ir::DType::F16);
        assert_eq!(to_le_bytes(&t), vec![0x00, 0x3c, 0x00, 0xc0]);
        let b = Tensor::Bool(ndarray::arr1(&[true, false]).into_dyn());
        assert_eq!(to_le_bytes(&b), vec![1, 0]);
    }
}
