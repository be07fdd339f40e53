//! Fused attention (`kernel::Attention`, made by the attention rules of rewrites/fusion.rules):
//! `attention.cu.hbs`. Every layout reaches the kernel as four strided views (an element offset
//! and batch, sequence and head strides of q, k, v and the output; the head-size axis is
//! contiguous), so heads-last, heads-first and packed-projection operands run the same code.
//! fp16 operands with a head size that is a multiple of 16 up to 128 (and equal for K and V)
//! run on tensor cores with an online softmax, so any sequence length fits; anything else (fp32
//! storage, other head sizes, views not 16-byte aligned) runs the per-row kernel, which keeps a
//! row's scores in shared memory.

use super::act::float_lit;
use super::{require_float, LowerSpec};
use crate::ir::dim::product;
use crate::ir::ops::kernel::{Attention, AttentionLayout, OperandOrder, OperandView};
use crate::ir::{DType, Dim, Node};
use crate::lower::{ctype, LowerCtx, LowerError, LowerResult};
use serde_json::{json, Map};

pub const OPS: &[LowerSpec] = &[LowerSpec::of::<Attention>("Attention", lower_attention)];

fn lower_attention(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<Attention>() else {
        return Err(LowerError::Invalid("not an Attention node".into()));
    };
    let (q, k, v) = (cx.input(node, 0)?, cx.input(node, 1)?, cx.input(node, 2)?);
    let mask = cx.opt_input(node, 3)?;
    require_float(cx, q, "attention")?;
    let o = cx.output(node, 0)?;
    let dt = cx.dtype(q);
    if cx.dtype(k) != dt || cx.dtype(v) != dt || cx.dtype(o) != dt {
        return Err(LowerError::Invalid("attention operands must share one element type".into()));
    }
    let (sizes, views) = operand_views(op, cx.shape(q), cx.shape(k), cx.shape(v))?;
    // A strided attention holds its own dims: substitute the ones bound at compile time.
    let [b, heads, sq, sk, d, dv] = sizes.map(|x| cx.bind(&x));
    let mut c = Map::new();
    c.insert("ctype".into(), json!(ctype(dt)));
    for (key, x) in [("b", &b), ("sq", &sq), ("sk", &sk), ("heads", &heads), ("d", &d), ("dv", &dv)] {
        c.insert(key.into(), json!(cx.expr(x)?));
    }
    for (name, view) in ["q", "k", "v", "o"].iter().zip(&views) {
        for (field, x) in
            [("off", &view.offset), ("sb", &view.batch), ("ss", &view.seq), ("sh", &view.head), ("sd", &view.dim)]
        {
            c.insert(format!("{name}_{field}"), json!(cx.expr(x)?));
        }
    }
    c.insert("scale".into(), json!(float_lit(op.scale)));
    let head = d.as_known().filter(|&x| x > 0 && x % 16 == 0 && x <= 128 && dv == d);
    c.insert("fast".into(), json!(dt == DType::F16 && head.is_some()));
    c.insert("head_dim".into(), json!(head.unwrap_or(0)));
    let mut args = vec![q, k, v];
    c.insert("has_mask".into(), json!(mask.is_some()));
    let flops = attention_flops(&b, &heads, &sq, &sk, &d, &dv);
    let scores = [b, heads, sq, sk];
    let strides = match mask {
        Some(m) => {
            c.insert("mask_ctype".into(), json!(ctype(cx.dtype(m))));
            c.insert("mask_arg".into(), json!(args.len()));
            args.push(m);
            broadcast_strides(cx.shape(m), &scores)?
        }
        None => vec![Dim::known(0); 4],
    };
    for (key, s) in ["mb", "mh", "mq", "mk"].iter().zip(&strides) {
        c.insert((*key).into(), json!(cx.expr(s)?));
    }
    // One mask value per key for every query row (a key-padding mask): staged per key tile.
    c.insert("mask_rows".into(), json!(mask.is_some() && strides[2] == Dim::known(0)));
    c.insert("o_arg".into(), json!(args.len()));
    args.push(o);
    let writes = vec![args.len() - 1];
    cx.emit(&node.name, "attention", args, writes, c, 0)?;
    cx.set_flops(&flops)
}

/// The two products of attention, multiply-adds ×2: Q·Kᵀ (2·B·H·Sq·Skv·D) and P·V
/// (2·B·H·Sq·Skv·Dv), so 4·B·H·Sq·Skv·D when Dv = D; the softmax and masking are not counted.
pub fn attention_flops(b: &Dim, heads: &Dim, sq: &Dim, sk: &Dim, d: &Dim, dv: &Dim) -> Dim {
    Dim::known(2).mul(b).mul(heads).mul(sq).mul(sk).mul(&d.add(dv))
}

/// `[B, H, Sq, Sk, D, Dv]` and the views of q, k, v and the output in their tensors.
fn operand_views(op: &Attention, q: &[Dim], k: &[Dim], v: &[Dim]) -> LowerResult<([Dim; 6], [OperandView; 4])> {
    let invalid = |e: crate::ir::OpError| LowerError::Invalid(e.0);
    if let AttentionLayout::Strided(st) = &op.layout {
        let sizes = [st.batch.clone(), st.heads.clone(), st.sq.clone(), st.sk.clone(), st.d.clone(), st.dv.clone()];
        return Ok((sizes, [st.q.clone(), st.k.clone(), st.v.clone(), st.o.clone()]));
    }
    let (order, k_order) = match op.layout {
        AttentionLayout::HeadsFirst => (OperandOrder::Bhsd, OperandOrder::Bhds),
        _ => (OperandOrder::Bshd, OperandOrder::Bshd),
    };
    let scores = op.scores_shape(q, k, v).map_err(invalid)?;
    let [b, h, sq, sk]: [Dim; 4] =
        scores.try_into().map_err(|_| LowerError::Invalid("attention scores must have rank 4".into()))?;
    let (d, dv) = (q[3].clone(), v[3].clone());
    let views = [
        OperandView::contiguous(order, &sq, &h, &d),
        OperandView::contiguous(k_order, &sk, &h, &d),
        OperandView::contiguous(order, &sk, &h, &dv),
        OperandView::contiguous(order, &sq, &h, &dv),
    ];
    Ok(([b, h, sq, sk, d, dv], views))
}

/// Element strides of `shape` (right-aligned) read as `target`: 0 along broadcast axes.
fn broadcast_strides(shape: &[Dim], target: &[Dim]) -> LowerResult<Vec<Dim>> {
    if shape.len() > target.len() {
        return Err(LowerError::Invalid(format!("mask of rank {} for scores of rank {}", shape.len(), target.len())));
    }
    let lead = target.len() - shape.len();
    let one = Dim::known(1);
    let mut out = Vec::with_capacity(target.len());
    for i in 0..target.len() {
        if i < lead || shape[i - lead] == one {
            out.push(Dim::known(0));
        } else if shape[i - lead] == target[i] {
            out.push(product(&shape[i - lead + 1..]));
        } else {
            return Err(LowerError::Invalid(format!(
                "mask dim {} does not broadcast to {}",
                shape[i - lead],
                target[i]
            )));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_strides_skip_broadcast_axes() {
        let s = |v: &[i64]| v.iter().map(|&d| Dim::known(d)).collect::<Vec<_>>();
        let target = s(&[2, 12, 7, 7]);
        assert_eq!(broadcast_strides(&s(&[2, 1, 7, 7]), &target).unwrap(), s(&[49, 0, 7, 1]));
        assert_eq!(broadcast_strides(&s(&[2, 1, 1, 7]), &target).unwrap(), s(&[7, 0, 0, 1]));
        assert_eq!(broadcast_strides(&s(&[7]), &target).unwrap(), s(&[0, 0, 0, 1]));
        assert!(broadcast_strides(&s(&[3, 7]), &target).is_err());
    }
}
