//! ONNX `Cast` and `CastLike`: a conversion kernel (`cast.cu.hbs`, shared with the graph-boundary
//! casts of `LowerCtx::emit_cast`), or no kernel at all when the source and target types have the
//! same device type (fp32 ↔ fp16 both live as fp16 on the device, or both as fp32 with
//! `--precision fp32`, so such casts are views: at fp32 precision a cast to fp16 does not round).
//!
//! Semantics follow the reference (`crate::ir::ops::cast::cast_tensor`): float → integer truncates
//! toward zero through int64 (saturating, NaN → 0) and then wraps to narrower integers; anything →
//! bool is `!= 0`; integer → integer wraps. The device converts from the fp16 value of a float
//! tensor (an fp32 input was rounded to fp16 at the boundary), so a value within fp16 rounding of
//! an integer may truncate differently than in fp32.

use super::LowerSpec;
use crate::ir::ops::cast::{CastLikeOp, CastOp};
use crate::ir::Node;
use crate::lower::{LowerCtx, LowerError, LowerResult};

pub const OPS: &[LowerSpec] =
    &[LowerSpec::of::<CastOp>("Cast", lower_cast), LowerSpec::of::<CastLikeOp>("CastLike", lower_cast)];

/// Cast (opset 1–21) and CastLike (opset 15+; the target type is input 1's): a view when the
/// device types agree, else a conversion kernel. Targets without a device type (float64,
/// bfloat16) are reported unsupported by `LowerCtx::device_dtype`.
fn lower_cast(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let x = cx.input(node, 0)?;
    let out_value = *node.outputs.first().ok_or_else(|| LowerError::Invalid("output 0 is missing".into()))?;
    let target = cx
        .graph
        .value(out_value)
        .ty
        .as_ref()
        .map(|t| t.dtype)
        .ok_or_else(|| LowerError::Invalid("the output has no inferred type".into()))?;
    if cx.device_dtype(target)? == cx.dtype(x) {
        cx.alias_output(node, 0, x)?;
        return Ok(());
    }
    let out = cx.output(node, 0)?;
    cx.emit_cast(&node.name, x, out)
}

#[cfg(test)]
mod tests {
    use super::super::elementwise::testkit::{lower, render, Builder};
    use super::*;
    use crate::ir::{DType, Dim};
    use crate::lower::Storage;

    fn cast(to: DType) -> Box<dyn crate::ir::Op> {
        Box::new(CastOp { to })
    }

    #[test]
    fn casts_become_kernels_or_views() {
        let mut b = Builder::new();
        let x = b.input("x", DType::F32, vec![Dim::sym("N"), Dim::known(10)]);
        let i = b.node(cast(DType::I64), &[Some(x)]);
        let h = b.node(cast(DType::F16), &[Some(x)]);
        let bo = b.node(cast(DType::Bool), &[Some(i[0])]);
        b.node(cast(DType::I32), &[Some(bo[0])]);
        b.node(cast(DType::F32), &[Some(bo[0])]);
        b.node(cast(DType::U8), &[Some(h[0])]);
        b.node(cast(DType::I64), &[Some(i[0])]);
        let p = lower(&b.g, OPS).unwrap();
        let pairs: Vec<(String, String)> = p
            .kernels
            .iter()
            .map(|k| {
                (
                    k.context["src_ctype"].as_str().unwrap().to_string(),
                    k.context["dst_ctype"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let want =
            [("half", "int64_t"), ("int64_t", "bool"), ("bool", "int32_t"), ("bool", "half"), ("half", "uint8_t")];
        assert_eq!(pairs, want.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>());
        // f32 → f16 and i64 → i64 are views of their input
        assert_eq!(p.tensors.iter().filter(|t| matches!(t.storage, Storage::Alias { .. })).count(), 2);
        render(&p, "cast");
        // every (src, dst) pair of device types renders and is compiled by hand (O2A_RENDER_DIR)
        let types = [
            DType::F16,
            DType::I8,
            DType::I16,
            DType::I32,
            DType::I64,
            DType::U8,
            DType::U16,
            DType::U32,
            DType::U64,
            DType::Bool,
        ];
        let mut b = Builder::new();
        for (k, &s) in types.iter().enumerate() {
            let x = b.input(&format!("x{k}"), s, vec![Dim::known(33)]);
            for &d in &types {
                b.node(cast(d), &[Some(x)]);
            }
        }
        let p = lower(&b.g, OPS).unwrap();
        assert_eq!(p.kernels.len(), types.len() * (types.len() - 1));
        render(&p, "cast_all");
        // float64 has no device type
        let mut b = Builder::new();
        let x = b.input("x", DType::F32, vec![Dim::known(3)]);
        b.node(cast(DType::F64), &[Some(x)]);
        assert!(matches!(lower(&b.g, OPS), Err(LowerError::Unsupported(_))));
    }

    /// fp32 precision: fp32 and fp16 are both fp32 on the device, so casts between them are views
    /// (no rounding to fp16); conversions to other types read floats.
    #[test]
    fn fp32_casts() {
        use super::super::elementwise::testkit::lower_at;
        use crate::lower::Precision;
        let mut b = Builder::new();
        let x = b.input("x", DType::F32, vec![Dim::sym("N"), Dim::known(10)]);
        let h = b.node(cast(DType::F16), &[Some(x)]);
        b.node(cast(DType::F32), &[Some(h[0])]);
        let i = b.node(cast(DType::I64), &[Some(h[0])]);
        b.node(cast(DType::F16), &[Some(i[0])]);
        let p = lower_at(&b.g, OPS, Precision::Fp32).unwrap();
        let pairs: Vec<(&str, &str)> = p
            .kernels
            .iter()
            .map(|k| (k.context["src_ctype"].as_str().unwrap(), k.context["dst_ctype"].as_str().unwrap()))
            .collect();
        assert_eq!(pairs, [("float", "int64_t"), ("int64_t", "float")]);
        assert_eq!(p.tensors.iter().filter(|t| matches!(t.storage, Storage::Alias { .. })).count(), 2);
        assert!(p.tensors.iter().all(|t| t.dtype != DType::F16));
        render(&p, "cast_fp32");
    }
}
