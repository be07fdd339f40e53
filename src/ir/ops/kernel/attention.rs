//! Fused scaled dot-product attention, the kernel the optimiser makes of the exported
//! `softmax(Q·Kᵀ·scale + mask)·V` subgraph with its head transposes (rewrites/fusion.rules).
//!
//! The rules make it in one of two plain layouts, whichever the export computes the scores in:
//! heads-last operands (Hugging Face BERT: `[B, S, H, D]`, a projection's `[B, S, H·D]` viewed
//! per head) or heads-first ones (`torch.nn.MultiheadAttention`, as in torchvision's ViT:
//! `[B, H, S, D]`, with k given as the scores product's right operand `kᵀ`, `[B, H, D, S]`). After extraction, `crate::egraph::views` folds the layout ops around it
//! (reshapes, head transposes, the `Gather` of q, k or v out of a packed projection) into
//! strided operand views ([`AttentionLayout::Strided`]): the kernel then reads q, k and v where
//! the projection wrote them and writes its output where the next product reads it.

use crate::ir::broadcast::broadcast_shapes;
use crate::ir::dim::{fmt_shape, product};
use crate::ir::{optional, required, Dim, Fact, Op, OpError, OpResult, Tensor};
use crate::op_ensure;
use crate::reference::kernel::attention as kernels;
use ndarray::{ArrayD, IxDyn};
use std::any::Any;
use std::collections::BTreeMap;

/// `O[b,h,i,:] = Σ_j softmax_j(Q[b,h,i,:]·K[b,h,j,:]·scale + mask[b,h,i,j]) · V[b,h,j,:]`.
///
/// Inputs: `q`, `k`, `v` as [`AttentionLayout`] says, and an optional additive `mask`
/// broadcastable to the scores `[B, H, Sq, Sk]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Attention {
    pub scale: f32,
    pub layout: AttentionLayout,
}

/// Where the operands and the output of an [`Attention`] live.
#[derive(Clone, Debug, PartialEq)]
pub enum AttentionLayout {
    /// `q` `[B, Sq, H, D]`, `k` `[B, Sk, H, D]`, `v` `[B, Sk, H, Dv]`; output `[B, Sq, H, Dv]`.
    HeadsLast,
    /// `q` `[B, H, Sq, D]`, `kᵀ` `[B, H, D, Sk]`, `v` `[B, H, Sk, Dv]`; output `[B, H, Sq, Dv]`.
    HeadsFirst,
    /// `q`, `k` and `v` are read through strided views of the input tensors, and the output is
    /// written through a view that covers each element of the output tensor once.
    Strided(Box<StridedOperands>),
}

/// A `[B, S, H, D]` operand inside another tensor: element `[b, s, h, c]` is element
/// `offset + b·batch + s·seq + h·head + c·dim` of the (contiguous) tensor. The tensor-core
/// kernel needs `dim` = 1 (a row of the operand is one run of memory).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperandView {
    pub offset: Dim,
    pub batch: Dim,
    pub seq: Dim,
    pub head: Dim,
    pub dim: Dim,
}

/// How a plain (contiguous) operand is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperandOrder {
    /// `[B, S, H, D]`
    Bshd,
    /// `[B, H, S, D]`
    Bhsd,
    /// `[B, H, D, S]` (a transposed key)
    Bhds,
}

impl OperandView {
    /// The view of a contiguous tensor of sequence length `s`, `h` heads of size `d`.
    pub fn contiguous(order: OperandOrder, s: &Dim, h: &Dim, d: &Dim) -> OperandView {
        let z = Dim::known(0);
        let all = product(&[s.clone(), h.clone(), d.clone()]);
        let one = Dim::known(1);
        match order {
            OperandOrder::Bshd => OperandView { offset: z, batch: all, seq: h.mul(d), head: d.clone(), dim: one },
            OperandOrder::Bhsd => OperandView { offset: z, batch: all, seq: d.clone(), head: s.mul(d), dim: one },
            OperandOrder::Bhds => OperandView { offset: z, batch: all, seq: one, head: s.mul(d), dim: s.clone() },
        }
    }
}

/// The sizes and views of a strided attention. `inputs` are the symbolic shapes of the q, k and
/// v tensors (the reference executor binds the run-time dims from them).
#[derive(Clone, Debug, PartialEq)]
pub struct StridedOperands {
    pub batch: Dim,
    pub heads: Dim,
    pub sq: Dim,
    pub sk: Dim,
    pub d: Dim,
    pub dv: Dim,
    pub q: OperandView,
    pub k: OperandView,
    pub v: OperandView,
    pub o: OperandView,
    pub inputs: [Vec<Dim>; 3],
    pub out_shape: Vec<Dim>,
}

impl Attention {
    pub fn heads_last(scale: f32) -> Attention {
        Attention { scale, layout: AttentionLayout::HeadsLast }
    }

    /// `[B, H, Sq, Sk, D, Dv]` of operands with these shapes (plain layouts only).
    fn sizes(&self, q: &[Dim], k: &[Dim], v: &[Dim]) -> OpResult<[Dim; 6]> {
        for (what, s) in [("q", q), ("k", k), ("v", v)] {
            op_ensure!(s.len() == 4, "{what} must have rank 4, found {}", fmt_shape(s));
        }
        let heads_first = match &self.layout {
            AttentionLayout::HeadsLast => false,
            AttentionLayout::HeadsFirst => true,
            AttentionLayout::Strided(_) => unreachable!("strided attention has its sizes"),
        };
        let (h, s) = if heads_first { (1, 2) } else { (2, 1) };
        // k: [B, S, H, D], or kᵀ [B, H, D, S] heads-first.
        let (ks, kd) = if heads_first { (3, 2) } else { (1, 3) };
        let layout = if heads_first { "q, v [B, H, S, D], kᵀ [B, H, D, S]" } else { "[B, S, H, D]" };
        op_ensure!(
            q[0] == k[0] && q[h] == k[h] && q[3] == k[kd],
            "q {} and k {} ({layout}) differ in batch, heads or head size",
            fmt_shape(q),
            fmt_shape(k)
        );
        op_ensure!(
            v[0] == k[0] && v[s] == k[ks] && v[h] == k[h],
            "k {} and v {} ({layout}) differ in batch, length or heads",
            fmt_shape(k),
            fmt_shape(v)
        );
        Ok([q[0].clone(), q[h].clone(), q[s].clone(), k[ks].clone(), q[3].clone(), v[3].clone()])
    }

    /// `[B, H, Sq, Sk]`: the shape the mask broadcasts to.
    pub fn scores_shape(&self, q: &[Dim], k: &[Dim], v: &[Dim]) -> OpResult<Vec<Dim>> {
        let [b, h, sq, sk, ..] = match &self.layout {
            AttentionLayout::Strided(st) => {
                [st.batch.clone(), st.heads.clone(), st.sq.clone(), st.sk.clone(), st.d.clone(), st.dv.clone()]
            }
            _ => self.sizes(q, k, v)?,
        };
        Ok(vec![b, h, sq, sk])
    }
}

impl Op for Attention {
    fn op_type(&self) -> &'static str {
        "Attention"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let q = required(inputs, 0, "q")?;
        let k = required(inputs, 1, "k")?;
        let v = required(inputs, 2, "v")?;
        op_ensure!(q.dtype().is_float(), "attention computes on floating-point tensors, found {}", q.dtype());
        for (what, f) in [("k", k), ("v", v)] {
            op_ensure!(f.dtype() == q.dtype(), "{what} is {} but q is {}", f.dtype(), q.dtype());
        }
        let scores = self.scores_shape(q.shape(), k.shape(), v.shape())?;
        if let Some(m) = optional(inputs, 3) {
            op_ensure!(m.dtype() == q.dtype(), "mask is {} but q is {}", m.dtype(), q.dtype());
            let joined = broadcast_shapes(&[&scores, m.shape()])?;
            op_ensure!(
                joined == scores,
                "mask {} does not broadcast to the scores {}",
                fmt_shape(m.shape()),
                fmt_shape(&scores)
            );
        }
        let out = match &self.layout {
            AttentionLayout::HeadsLast => {
                let [b, h, sq, _, _, dv] = self.sizes(q.shape(), k.shape(), v.shape())?;
                vec![b, sq, h, dv]
            }
            AttentionLayout::HeadsFirst => {
                let [b, h, sq, _, _, dv] = self.sizes(q.shape(), k.shape(), v.shape())?;
                vec![b, h, sq, dv]
            }
            AttentionLayout::Strided(st) => {
                for (i, (what, f)) in [("q", q), ("k", k), ("v", v)].into_iter().enumerate() {
                    op_ensure!(
                        f.shape() == st.inputs[i].as_slice(),
                        "{what} is {} but the strided attention was made for {}",
                        fmt_shape(f.shape()),
                        fmt_shape(&st.inputs[i])
                    );
                }
                st.out_shape.clone()
            }
        };
        Ok(vec![Fact::new(q.dtype(), out)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let q = required(inputs, 0, "q")?;
        let k = required(inputs, 1, "k")?.to_f32();
        let v = required(inputs, 2, "v")?.to_f32();
        let mask = optional(inputs, 3).map(|m| m.to_f32());
        let out = match &self.layout {
            AttentionLayout::HeadsLast => kernels::attention(&q.to_f32(), &k, &v, mask.as_ref(), self.scale)?,
            AttentionLayout::HeadsFirst => {
                let perm =
                    |a: &ArrayD<f32>, p: &[usize]| a.clone().permuted_axes(IxDyn(p)).as_standard_layout().to_owned();
                for (what, a) in [("q", q.shape()), ("k", k.shape()), ("v", v.shape())] {
                    op_ensure!(a.len() == 4, "attention: {what} {a:?} is not rank 4");
                }
                let swap = [0, 2, 1, 3];
                let o = kernels::attention(
                    &perm(&q.to_f32(), &swap),
                    &perm(&k, &[0, 3, 1, 2]),
                    &perm(&v, &swap),
                    mask.as_ref(),
                    self.scale,
                )?;
                perm(&o, &swap)
            }
            AttentionLayout::Strided(st) => strided_eval(st, &q.to_f32(), &k, &v, mask.as_ref(), self.scale)?,
        };
        Ok(vec![Tensor::F32(out).cast(q.dtype())])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Binds the symbols of `dims` from the run-time sizes `sizes` (a dim `c·s` gives `s`).
fn bind(dims: &[Dim], sizes: &[usize], env: &mut BTreeMap<String, i64>) {
    for (d, &n) in dims.iter().zip(sizes) {
        let terms: Vec<(&[String], i64)> = d.terms().collect();
        if let [(mono, c)] = terms.as_slice() {
            if let [s] = mono {
                if *c != 0 && n as i64 % c == 0 {
                    env.entry(s.clone()).or_insert(n as i64 / c);
                }
            }
        }
    }
}

/// The strided layout's reference: gathers q, k and v through their views, runs the plain
/// kernel, and scatters the output through its view (every element of the output written once).
fn strided_eval(
    st: &StridedOperands,
    q: &ArrayD<f32>,
    k: &ArrayD<f32>,
    v: &ArrayD<f32>,
    mask: Option<&ArrayD<f32>>,
    scale: f32,
) -> OpResult<ArrayD<f32>> {
    let mut env = BTreeMap::new();
    for (i, t) in [q, k, v].into_iter().enumerate() {
        bind(&st.inputs[i], t.shape(), &mut env);
    }
    let eval = |d: &Dim| -> OpResult<i64> {
        d.eval(&env)
            .as_known()
            .ok_or_else(|| OpError(format!("attention: cannot evaluate the view dim {d} at run time")))
    };
    for (i, t) in [q, k, v].into_iter().enumerate() {
        let want: Vec<i64> = st.inputs[i].iter().map(eval).collect::<OpResult<_>>()?;
        let got: Vec<i64> = t.shape().iter().map(|&n| n as i64).collect();
        op_ensure!(want == got, "attention: input {i} is {got:?}, the views were made for {want:?}");
    }
    let [b, h, sq, sk, d, dv] =
        [&st.batch, &st.heads, &st.sq, &st.sk, &st.d, &st.dv].map(|x| eval(x).map(|n| n.max(0) as usize));
    let (b, h, sq, sk, d, dv) = (b?, h?, sq?, sk?, d?, dv?);
    let gather = |t: &ArrayD<f32>, view: &OperandView, s: usize, w: usize, what: &str| -> OpResult<ArrayD<f32>> {
        let flat: Vec<f32> = t.iter().copied().collect();
        let [o, sb, ss, sh, sd] = [&view.offset, &view.batch, &view.seq, &view.head, &view.dim].map(eval);
        let (o, sb, ss, sh, sd) = (o?, sb?, ss?, sh?, sd?);
        let mut out = ArrayD::<f32>::zeros(IxDyn(&[b, s, h, w]));
        for ((bi, si, hi, di), x) in out.indexed_iter_mut().map(|(ix, x)| ((ix[0], ix[1], ix[2], ix[3]), x)) {
            let at = o + bi as i64 * sb + si as i64 * ss + hi as i64 * sh + di as i64 * sd;
            *x = *usize::try_from(at)
                .ok()
                .and_then(|a| flat.get(a))
                .ok_or_else(|| OpError(format!("attention: the {what} view reads element {at} of {}", flat.len())))?;
        }
        Ok(out)
    };
    let o = kernels::attention(
        &gather(q, &st.q, sq, d, "q")?,
        &gather(k, &st.k, sk, d, "k")?,
        &gather(v, &st.v, sk, dv, "v")?,
        mask,
        scale,
    )?;
    let shape: Vec<usize> = st.out_shape.iter().map(|x| eval(x).map(|n| n.max(0) as usize)).collect::<OpResult<_>>()?;
    let n: usize = shape.iter().product();
    op_ensure!(n == o.len(), "attention: the output view covers {} elements of an output of {n}", o.len());
    let mut flat = vec![0f32; n];
    let mut written = vec![false; n];
    let [off, sb, ss, sh, sd] = [&st.o.offset, &st.o.batch, &st.o.seq, &st.o.head, &st.o.dim].map(eval);
    let (off, sb, ss, sh, sd) = (off?, sb?, ss?, sh?, sd?);
    for (ix, &x) in o.indexed_iter() {
        let at = off + ix[0] as i64 * sb + ix[1] as i64 * ss + ix[2] as i64 * sh + ix[3] as i64 * sd;
        let a = usize::try_from(at).ok().filter(|&a| a < n && !written[a]).ok_or_else(|| {
            OpError(format!("attention: the output view writes element {at} of {n} twice or out of range"))
        })?;
        flat[a] = x;
        written[a] = true;
    }
    ArrayD::from_shape_vec(IxDyn(&shape), flat).map_err(|e| OpError(format!("attention: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arr(shape: &[usize], f: impl Fn(usize) -> f32) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::F32(ArrayD::from_shape_vec(IxDyn(shape), (0..n).map(f).collect()).unwrap())
    }
    fn dims(v: &[i64]) -> Vec<Dim> {
        v.iter().map(|&x| Dim::known(x)).collect()
    }
    fn run(op: &Attention, ins: &[&Tensor]) -> ArrayD<f32> {
        let ins: Vec<Option<&Tensor>> = ins.iter().map(|t| Some(*t)).collect();
        op.eval(&ins).unwrap().remove(0).to_f32()
    }

    /// The heads-first layout is the heads-last one with the middle axes swapped.
    #[test]
    fn heads_first_is_heads_last_transposed() {
        let (b, s, h, d) = (2, 5, 3, 4);
        let f = |i: usize| ((i * 37) % 23) as f32 / 11.0 - 1.0;
        let (q, k, v) = (arr(&[b, s, h, d], f), arr(&[b, s, h, d], |i| f(i + 7)), arr(&[b, s, h, d], |i| f(i + 3)));
        let want = run(&Attention::heads_last(0.5), &[&q, &k, &v]);
        let perm =
            |t: &Tensor, p: &[usize]| Tensor::F32(t.to_f32().permuted_axes(IxDyn(p)).as_standard_layout().to_owned());
        let sw = [0, 2, 1, 3];
        let kt = perm(&k, &[0, 2, 3, 1]);
        let got =
            run(&Attention { scale: 0.5, layout: AttentionLayout::HeadsFirst }, &[&perm(&q, &sw), &kt, &perm(&v, &sw)]);
        assert_eq!(got.permuted_axes(IxDyn(&sw)).as_standard_layout().to_owned(), want);
        let (b, h, s, d) = (b as i64, h as i64, s as i64, d as i64);
        let f = Fact::new(crate::ir::DType::F32, dims(&[b, h, s, d]));
        let ft = Fact::new(crate::ir::DType::F32, dims(&[b, h, d, s + 1]));
        let fv = Fact::new(crate::ir::DType::F32, dims(&[b, h, s + 1, d]));
        let out = Attention { scale: 1.0, layout: AttentionLayout::HeadsFirst }
            .infer(&[Some(&f), Some(&ft), Some(&fv)])
            .unwrap();
        assert_eq!(out[0].shape(), dims(&[b, h, s, d]).as_slice());
    }

    /// q, k and v packed in one `[B, S, 3·H·D]` projection and the output written heads-first:
    /// the strided layout computes what the plain one does on the unpacked operands.
    #[test]
    fn strided_views_read_a_packed_projection() {
        let (b, s, h, d) = (2usize, 3usize, 2usize, 4usize);
        let e = h * d;
        let packed = arr(&[b, s, 3 * e], |i| ((i * 13) % 17) as f32 / 8.0 - 1.0);
        let p = packed.to_f32();
        let part = |j: usize| {
            Tensor::F32(ArrayD::from_shape_fn(IxDyn(&[b, s, h, d]), |ix| p[[ix[0], ix[1], j * e + ix[2] * d + ix[3]]]))
        };
        let plain = run(&Attention::heads_last(0.7), &[&part(0), &part(1), &part(2)]);
        let n = |x: usize| Dim::known(x as i64);
        let view =
            |j: usize| OperandView { offset: n(j * e), batch: n(s * 3 * e), seq: n(3 * e), head: n(d), dim: n(1) };
        let st = StridedOperands {
            batch: n(b),
            heads: n(h),
            sq: n(s),
            sk: n(s),
            d: n(d),
            dv: n(d),
            q: view(0),
            k: view(1),
            v: view(2),
            o: OperandView::contiguous(OperandOrder::Bhsd, &n(s), &n(h), &n(d)),
            inputs: [dims(&[2, 3, 24]), dims(&[2, 3, 24]), dims(&[2, 3, 24])],
            out_shape: dims(&[2, 2, 3, 4]),
        };
        let op = Attention { scale: 0.7, layout: AttentionLayout::Strided(Box::new(st)) };
        let got = run(&op, &[&packed, &packed, &packed]);
        assert_eq!(got.permuted_axes(IxDyn(&[0, 2, 1, 3])).as_standard_layout().to_owned(), plain);
    }

    /// A view that runs past its tensor, or an output view that misses elements, is an error.
    #[test]
    fn views_outside_their_tensors_are_errors() {
        let n = |x: i64| Dim::known(x);
        let t = arr(&[1, 2, 1, 2], |i| i as f32);
        let st = |o: OperandView| StridedOperands {
            batch: n(1),
            heads: n(1),
            sq: n(2),
            sk: n(2),
            d: n(2),
            dv: n(2),
            q: OperandView { offset: n(2), batch: n(4), seq: n(2), head: n(2), dim: n(1) },
            k: OperandView::contiguous(OperandOrder::Bshd, &n(2), &n(1), &n(2)),
            v: OperandView::contiguous(OperandOrder::Bshd, &n(2), &n(1), &n(2)),
            o,
            inputs: [dims(&[1, 2, 1, 2]), dims(&[1, 2, 1, 2]), dims(&[1, 2, 1, 2])],
            out_shape: dims(&[1, 2, 1, 2]),
        };
        let op = Attention {
            scale: 1.0,
            layout: AttentionLayout::Strided(Box::new(st(OperandView::contiguous(
                OperandOrder::Bshd,
                &n(2),
                &n(1),
                &n(2),
            )))),
        };
        assert!(op.eval(&[Some(&t), Some(&t), Some(&t)]).is_err(), "q reads past the end");
    }
}
