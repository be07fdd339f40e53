//! Program-level fusion of kernels the lowering emits one after another, run on the finished
//! [`Program`] before memory planning.
//!
//! Two patterns. First, a max pooling that alone reads a thin-stem convolution's output fuses
//! into the stem kernel's store (`fuse_stem_pools`; ResNet's 3x3/2 pooling after its 7x7/2
//! stem): the stem's map is never written. Then the channels-first model input: a cast of the
//! caller's fp32 (or fp16) NCHW tensor to fp16, the `transpose` family's tiled matrix transpose
//! NCHW → NHWC (`[B, C, HW] → [B, HW, C]`) and the `pad_channels` kernel of a thin convolution
//! (C = 3 → 4; a thin stem with a wider filter runs on the stem kernel or the im2col path
//! instead, both of which read the unpadded input, see `ops::conv`, and then only the cast and
//! the transpose fuse) are three passes over the input. Any two or three of them in that order — cast →
//! transpose → pad, cast → transpose, transpose → pad — become one [`NCHW_TO_NHWC_TEMPLATE`]
//! kernel that reads the original input and writes the padded fp16 NHWC tensor. Where the
//! (unpadded) transposed tensor feeds only a stem convolution (`KernelFacts::StemConv`), the chain
//! ends in the stem instead and no layout kernel remains: the stem kernel reads the NCHW input
//! itself, converting each element as the cast does (on an H100 at batch 256, ResNet-50's
//! transform and stem took 0.093 + 0.411 ms, the stem alone then 0.479 ms). The kernels are
//! recognised by the [`KernelFacts`] their lowerings record, and the fused kernel's launcher
//! arguments come from theirs ([`KernelInstance::launcher_args`]): the template fields are only
//! rendered, never read back.
//!
//! A chain fuses only when every intermediate tensor is private to it: an arena temporary that
//! is no graph input or output, has no view (alias), is written by exactly the previous kernel
//! of the chain and read by exactly the next one. The fused kernel runs where the chain's last
//! kernel ran (its output is produced at the same point as before), and reads the chain's input
//! there, so the chain is left alone when a kernel in between writes that input's bytes.
//! The intermediates are removed from `program.tensors` (ids renumbered) and the kernels are
//! renamed `k000_…` in their new order, so the generated tree has no holes.
//!
//! The semantics are exactly the chain's: `o2a_cvt<half>` (the cast kernel's conversion), a copy,
//! zero channels (and the stem's own convolution).

use super::dim_expr;
use super::ops::conv::{stem_pool_fields, stem_pool_tile};
use super::program::{KernelFacts, KernelInstance, LauncherArg, Program, Storage, TensorId};
use crate::ir::{DType, Dim};
use serde_json::{json, Map, Value as Json};

/// The fused layout transform's template (`templates/<target>/kernels/nchw_to_nhwc.cu.hbs`).
pub const NCHW_TO_NHWC_TEMPLATE: &str = "nchw_to_nhwc";
/// Up to this many output channels, one thread computes a whole pixel; beyond, tiles through
/// shared memory (see the template).
const THIN_MAX_CHANNELS: i64 = 16;
/// The tiled kernel puts channel tiles of 32 on grid.y (at most 65535).
const MAX_CHANNELS: i64 = 32 * 65535;

/// Merges chains of boundary kernels into one kernel where the intermediate tensors have no other
/// reader.
pub fn fuse_program(program: &mut Program) {
    // First the pooling into the stem: the layout chain then ends in the pooled stem.
    fuse_stem_pools(program);
    let chains = find_chains(program);
    if chains.is_empty() {
        return;
    }
    let mut replaced: Vec<Option<KernelInstance>> = vec![None; program.kernels.len()];
    let mut removed = vec![false; program.kernels.len()];
    let mut dead = vec![false; program.tensors.len()];
    for ch in &chains {
        let Some(fused) = fused_kernel(program, ch) else { continue };
        let Some((&last, rest)) = ch.kernels.split_last() else { continue };
        for &k in rest {
            removed[k] = true;
        }
        replaced[last] = Some(fused);
        for &t in &ch.intermediates {
            dead[t] = true;
        }
    }
    let old = std::mem::take(&mut program.kernels);
    for (k, (kernel, new)) in old.into_iter().zip(replaced).enumerate() {
        if !removed[k] {
            program.kernels.push(new.unwrap_or(kernel));
        }
    }
    remove_tensors(program, &dead);
    renumber_kernels(program);
}

/// One chain: its kernels in run order, the tensor it reads, the tensor it writes.
#[derive(Clone, Debug)]
struct Chain {
    kernels: Vec<usize>,
    src: TensorId,
    /// The fused layout kernel's output; for a chain ending in a stem, the transposed tensor,
    /// which goes away with the chain.
    out: TensorId,
    /// Tensors only the chain's kernels touch, gone after the fusion.
    intermediates: Vec<TensorId>,
    /// The transpose: `[batches, c_in, pixels] → [batches, pixels, c_in]`.
    batches: Dim,
    pixels: Dim,
    c_in: i64,
    /// Channels after padding (`c_in` without a pad kernel).
    c_out: i64,
    /// The chain ends in a stem convolution that reads the transposed tensor at this argument
    /// slot: the stem then reads `src` itself, and no layout kernel remains.
    stem_x_slot: Option<usize>,
}

/// Who touches each tensor.
struct Uses {
    readers: Vec<Vec<usize>>,
    writers: Vec<Vec<usize>>,
    /// Some tensor is a view of it.
    viewed: Vec<bool>,
    /// A graph input or output is bound to it.
    io: Vec<bool>,
}

impl Uses {
    fn of(p: &Program) -> Uses {
        let n = p.tensors.len();
        let mut u = Uses {
            readers: vec![Vec::new(); n],
            writers: vec![Vec::new(); n],
            viewed: vec![false; n],
            io: vec![false; n],
        };
        for (k, kernel) in p.kernels.iter().enumerate() {
            for (slot, &t) in kernel.args.iter().enumerate() {
                let list = if kernel.writes.contains(&slot) { &mut u.writers[t] } else { &mut u.readers[t] };
                if list.last() != Some(&k) {
                    list.push(k);
                }
            }
        }
        for t in &p.tensors {
            if let Storage::Alias { of } = t.storage {
                u.viewed[of] = true;
            }
        }
        for io in p.inputs.iter().chain(&p.outputs) {
            u.io[io.tensor] = true;
        }
        u
    }

    /// `t` is an arena temporary written only by kernel `from` and read only by kernel `to`.
    fn private(&self, p: &Program, t: TensorId, from: usize, to: usize) -> bool {
        matches!(p.tensors[t].storage, Storage::Arena { .. })
            && !self.viewed[t]
            && !self.io[t]
            && self.writers[t] == [from]
            && self.readers[t] == [to]
            && from < to
    }
}

/// A conversion to fp16 of an fp32 or fp16 tensor (`LowerCtx::emit_cast`).
fn as_cast(p: &Program, k: &KernelInstance) -> Option<(TensorId, TensorId)> {
    let &[src, dst] = k.args.as_slice() else { return None };
    let ok = k.facts == KernelFacts::Cast
        && k.writes == [1]
        && matches!(p.tensors[src].dtype, DType::F32 | DType::F16)
        && p.tensors[dst].dtype == DType::F16
        && p.tensors[src].shape == p.tensors[dst].shape;
    ok.then_some((src, dst))
}

/// The `transpose` family's tiled form over fp16, `[batches, rows, cols] → [batches, cols, rows]`,
/// with a compile-time row count.
struct Tiled {
    x: TensorId,
    y: TensorId,
    batches: Dim,
    rows: i64,
    cols: Dim,
}

fn as_tiled(p: &Program, k: &KernelInstance) -> Option<Tiled> {
    let KernelFacts::TiledTranspose { batches, rows, cols } = &k.facts else { return None };
    let &[x, y] = k.args.as_slice() else { return None };
    let ok = k.writes == [1] && p.tensors[x].dtype == DType::F16 && p.tensors[y].dtype == DType::F16;
    if !ok {
        return None;
    }
    let rows = rows.as_known().filter(|&r| (1..=MAX_CHANNELS).contains(&r))?;
    // The output is [.., rows] in memory order: its innermost dim is the channel count.
    if p.tensors[y].shape.last() != Some(&Dim::known(rows)) {
        return None;
    }
    Some(Tiled { x, y, batches: batches.clone(), rows, cols: cols.clone() })
}

/// `pad_channels` (`ops::conv`): (x, out, c_in, c_out).
fn as_pad(p: &Program, k: &KernelInstance) -> Option<(TensorId, TensorId, i64, i64)> {
    let KernelFacts::PadChannels { x_slot, out_slot, c_in, c_out } = k.facts else { return None };
    let (&x, &out) = (k.args.get(x_slot)?, k.args.get(out_slot)?);
    let (xs, os) = (&p.tensors[x].shape, &p.tensors[out].shape);
    let ok = k.args.len() == 2
        && x_slot != out_slot
        && k.writes == [out_slot]
        && 1 <= c_in
        && c_in <= c_out
        && c_out <= MAX_CHANNELS
        && p.tensors[x].dtype == DType::F16
        && p.tensors[out].dtype == DType::F16
        && xs.len() == os.len()
        && xs.split_last().is_some_and(|(l, lead)| *l == Dim::known(c_in) && lead == &os[..os.len() - 1])
        && os.last() == Some(&Dim::known(c_out));
    ok.then_some((x, out, c_in, c_out))
}

/// A stem convolution (`KernelFacts::StemConv`) reading the tiled transpose `tr`'s output
/// `[batches, pixels, rows]` as its `[N, H, W, C]` input: its argument slot.
fn as_stem(p: &Program, k: &KernelInstance, tr: &Tiled) -> Option<usize> {
    let KernelFacts::StemConv(stem) = &k.facts else { return None };
    let x_slot = stem.x_slot;
    let x = p.tensors.get(*k.args.get(x_slot)?)?;
    let [n, h, w, c] = x.shape.as_slice() else { return None };
    let pixels = h.as_known()?.checked_mul(w.as_known()?)?;
    let ok = k.args[x_slot] == tr.y
        && !k.writes.contains(&x_slot)
        && x.dtype == DType::F16
        && *n == tr.batches
        && c.as_known() == Some(tr.rows)
        && tr.cols.as_known() == Some(pixels);
    ok.then_some(x_slot)
}

/// Every fusable chain, in run order, no kernel in two chains.
fn find_chains(p: &Program) -> Vec<Chain> {
    let uses = Uses::of(p);
    let mut claimed = vec![false; p.kernels.len()];
    let mut chains = Vec::new();
    // The kernel that alone reads `t`, written only by kernel `from`.
    let sole_reader = |t: TensorId, from: usize| -> Option<usize> {
        let &[to] = uses.readers[t].as_slice() else { return None };
        uses.private(p, t, from, to).then_some(to)
    };
    for (k, kernel) in p.kernels.iter().enumerate() {
        if claimed[k] {
            continue;
        }
        // The head: a cast feeding a tiled transpose, or a tiled transpose.
        let mut kernels = vec![k];
        let mut intermediates = Vec::new();
        let (src, tr_k, tr) = if let Some((src, dst)) = as_cast(p, kernel) {
            let Some(r) = sole_reader(dst, k) else { continue };
            let Some(tr) = as_tiled(p, &p.kernels[r]).filter(|t| t.x == dst) else { continue };
            kernels.push(r);
            intermediates.push(dst);
            (src, r, tr)
        } else if let Some(tr) = as_tiled(p, kernel) {
            (tr.x, k, tr)
        } else {
            continue;
        };
        if claimed[tr_k] {
            continue;
        }
        // The tail: an optional pad of the transposed channels, or the stem convolution that
        // reads them (it can read the NCHW input itself).
        let mut out = tr.y;
        let mut c_out = tr.rows;
        let mut stem_x_slot = None;
        if let Some(q) = sole_reader(tr.y, tr_k).filter(|&q| !claimed[q]) {
            if let Some((x, padded, c_in, cp)) = as_pad(p, &p.kernels[q]) {
                if x == tr.y && c_in == tr.rows {
                    kernels.push(q);
                    intermediates.push(tr.y);
                    out = padded;
                    c_out = cp;
                }
            } else if let Some(slot) = as_stem(p, &p.kernels[q], &tr) {
                kernels.push(q);
                intermediates.push(tr.y);
                stem_x_slot = Some(slot);
            }
        }
        let last = *kernels.last().expect("non-empty");
        if kernels.len() < 2 || stem_x_slot.is_none() && uses.writers[out].as_slice() != [last] {
            continue;
        }
        // The fused kernel reads `src` where the last kernel ran: nothing in between may write it.
        let (first, last) = (kernels[0], kernels[kernels.len() - 1]);
        let base = p.base(src);
        let overwritten = p.kernels[first + 1..last]
            .iter()
            .any(|k| k.writes.iter().any(|&s| k.args.get(s).is_some_and(|&t| p.base(t) == base)));
        if overwritten {
            continue;
        }
        for &c in &kernels {
            claimed[c] = true;
        }
        chains.push(Chain {
            kernels,
            src,
            out,
            intermediates,
            batches: tr.batches,
            pixels: tr.cols,
            c_in: tr.rows,
            c_out,
            stem_x_slot,
        });
    }
    chains
}

/// Halves per store: the widest of 8, 4, 2, 1 that divides the channel count, so every pixel's
/// first channel is aligned for it.
fn store_width(c_out: i64) -> i64 {
    [8, 4, 2, 1].into_iter().find(|w| c_out % w == 0).unwrap_or(1)
}

/// How the chain's kernels pass tensor `t` to their launchers.
fn launcher_arg(p: &Program, t: TensorId, kernels: &[usize]) -> Option<LauncherArg> {
    kernels.iter().find_map(|&k| {
        let kernel = &p.kernels[k];
        let slot = kernel.args.iter().position(|&a| a == t)?;
        kernel.launcher_args.get(slot).cloned()
    })
}

/// The C++ type of the chain's input, which the fused kernels read as fp32 or fp16 only.
fn src_ctype(p: &Program, ch: &Chain) -> Option<&'static str> {
    let dt = p.tensors[ch.src].dtype;
    matches!(dt, DType::F32 | DType::F16).then(|| super::ctype(dt))
}

/// The chain's nodes, each once, in run order.
fn chain_nodes(p: &Program, ch: &Chain) -> String {
    let mut nodes: Vec<&str> = Vec::new();
    for &k in &ch.kernels {
        let n = p.kernels[k].node.as_str();
        if !nodes.contains(&n) {
            nodes.push(n);
        }
    }
    nodes.join(", ")
}

/// The fused kernel of a chain.
fn fused_kernel(p: &Program, ch: &Chain) -> Option<KernelInstance> {
    if let Some(x_slot) = ch.stem_x_slot {
        return fused_stem(p, ch, x_slot);
    }
    let mut launcher_args = Vec::new();
    for (index, t) in [ch.src, ch.out].into_iter().enumerate() {
        launcher_args.push(LauncherArg { index, ..launcher_arg(p, t, &ch.kernels)? });
    }
    let src_ctype = src_ctype(p, ch)?;
    // Numbered at the last kernel's position for now, renumbered with the others.
    let name = format!("k{:03}_{NCHW_TO_NHWC_TEMPLATE}", ch.kernels.last()?);
    let mut c = Map::new();
    c.insert("name".into(), json!(name));
    c.insert("args".into(), Json::Array(launcher_args.iter().map(LauncherArg::template_fields).collect()));
    c.insert("src_ctype".into(), json!(src_ctype));
    c.insert("batches".into(), json!(dim_expr(&ch.batches, &p.dims).ok()?));
    c.insert("pixels".into(), json!(dim_expr(&ch.pixels, &p.dims).ok()?));
    c.insert("c_in".into(), json!(ch.c_in));
    c.insert("c_out".into(), json!(ch.c_out));
    c.insert("vec".into(), json!(store_width(ch.c_out)));
    c.insert("thin".into(), json!(ch.c_out <= THIN_MAX_CHANNELS));
    Some(KernelInstance {
        name,
        template: NCHW_TO_NHWC_TEMPLATE.to_string(),
        node: chain_nodes(p, ch),
        args: vec![ch.src, ch.out],
        writes: vec![1],
        workspace_bytes: 0,
        flops: Dim::known(0),
        context: c,
        launcher_args,
        dispatch: Vec::new(),
        facts: KernelFacts::Opaque,
    })
}

/// A chain ending in a stem convolution: the stem kernel reading the chain's NCHW input at
/// `x_slot` (template fields `x_nchw`, `x_ctype`), converting as the cast kernel does
/// (`o2a_cvt<half>`). Its other arguments, fields and name are the stem's.
fn fused_stem(p: &Program, ch: &Chain, x_slot: usize) -> Option<KernelInstance> {
    let &stem = ch.kernels.last()?;
    let mut k = p.kernels.get(stem)?.clone();
    let x_ctype = src_ctype(p, ch)?;
    *k.args.get_mut(x_slot)? = ch.src;
    *k.launcher_args.get_mut(x_slot)? = LauncherArg { index: x_slot, ..launcher_arg(p, ch.src, &ch.kernels)? };
    let c = &mut k.context;
    c.insert("args".into(), Json::Array(k.launcher_args.iter().map(LauncherArg::template_fields).collect()));
    c.insert("x_nchw".into(), json!(true));
    c.insert("x_ctype".into(), json!(x_ctype));
    k.node = chain_nodes(p, ch);
    // Its input is no longer the NHWC fp16 tensor the fact describes.
    k.facts = KernelFacts::Opaque;
    Some(k)
}

/// Fuses each max pooling that alone reads a thin-stem convolution's output into the stem
/// kernel, where `ops::conv::stem_pool_tile` finds a tile for it: the stem's map is then never
/// written, only the pooled one (on an H100 at batch 256, ResNet-50's stem wrote 411 MB that the
/// pooling read back, 0.473 + 0.188 ms). The fused kernel runs where the stem ran and writes the
/// pooled tensor there, which nothing reads before the pooling did; it keeps the stem's name,
/// work (the convolution's useful flops) and facts (with the pooled tile).
fn fuse_stem_pools(program: &mut Program) {
    let uses = Uses::of(program);
    let mut fused: Vec<(usize, usize, TensorId, KernelInstance)> = Vec::new();
    for (k, kernel) in program.kernels.iter().enumerate() {
        if let Some((q, t, instance)) = pooled_stem(program, &uses, k, kernel) {
            fused.push((k, q, t, instance));
        }
    }
    if fused.is_empty() {
        return;
    }
    let mut removed = vec![false; program.kernels.len()];
    let mut dead = vec![false; program.tensors.len()];
    for (k, q, t, instance) in fused {
        program.kernels[k] = instance;
        removed[q] = true;
        dead[t] = true;
    }
    let old = std::mem::take(&mut program.kernels);
    program.kernels = old.into_iter().zip(removed).filter(|(_, r)| !r).map(|(k, _)| k).collect();
    remove_tensors(program, &dead);
    renumber_kernels(program);
}

/// Stem kernel `k` with the max pooling that alone reads its output fused in: the pooling's
/// kernel index, the stem's output tensor (gone after the fusion) and the fused kernel.
fn pooled_stem(
    p: &Program,
    uses: &Uses,
    k: usize,
    kernel: &KernelInstance,
) -> Option<(usize, TensorId, KernelInstance)> {
    let KernelFacts::StemConv(stem) = &kernel.facts else { return None };
    let t = *kernel.args.get(stem.out_slot)?;
    let &[q] = uses.readers[t].as_slice() else { return None };
    if !uses.private(p, t, k, q) {
        return None;
    }
    let pool = &p.kernels[q];
    let KernelFacts::MaxPool2d { x_slot, out_slot, kernel: window, strides, pads, out } = pool.facts else {
        return None;
    };
    let pooled = *pool.args.get(out_slot)?;
    if pool.args.get(x_slot) != Some(&t) || pool.args.len() != 2 || uses.writers[pooled] != [q] {
        return None;
    }
    // Written earlier now: nothing may read it before the pooling wrote it, and it shares its
    // bytes with no other tensor (a view into a larger buffer, or viewed by others).
    let alias = matches!(p.tensors[pooled].storage, Storage::Alias { .. }) || uses.viewed[pooled];
    if alias || uses.readers[pooled].iter().any(|&r| r <= q) {
        return None;
    }
    // The stem's [N, P, Q, K] map pooled to [N, out, K].
    let pr = &stem.problem;
    let known = |dims: &[Dim]| dims.iter().map(Dim::as_known).collect::<Option<Vec<i64>>>();
    let (ts, ps) = (&p.tensors[t].shape, &p.tensors[pooled].shape);
    let ([tn, tail @ ..], [pn, ptail @ ..]) = (ts.as_slice(), ps.as_slice()) else { return None };
    let shapes_ok = tn == pn
        && known(tail)? == [pr.p, pr.q, pr.k]
        && known(ptail)? == [out[0], out[1], pr.k]
        && p.tensors[pooled].dtype == DType::F16;
    if !shapes_ok {
        return None;
    }
    let tile = stem_pool_tile(pr, &stem.tile, window, strides, pads, out, 2)?;
    // A one-pass tile too, for grids of fewer two-pass tiles than SMs (small batches).
    let small_grid = stem_pool_tile(pr, &stem.tile, window, strides, pads, out, 1);
    let mut fused = kernel.clone();
    fused.args[stem.out_slot] = pooled;
    fused.launcher_args[stem.out_slot] = LauncherArg { index: stem.out_slot, ..launcher_arg(p, pooled, &[q])? };
    let c = &mut fused.context;
    c.insert("args".into(), Json::Array(fused.launcher_args.iter().map(LauncherArg::template_fields).collect()));
    stem_pool_fields(&tile, small_grid.as_ref(), c);
    fused.node = format!("{}, {}", kernel.node, pool.node);
    let mut facts = stem.clone();
    facts.tile = tile;
    fused.facts = KernelFacts::StemConv(facts);
    Some((q, t, fused))
}

/// Drops the tensors marked dead (no kernel, view or graph io refers to them) and renumbers the
/// others in order.
pub(super) fn remove_tensors(p: &mut Program, dead: &[bool]) {
    let mut new_id = vec![usize::MAX; p.tensors.len()];
    let mut next = 0;
    for (t, &d) in dead.iter().enumerate() {
        if !d {
            new_id[t] = next;
            next += 1;
        }
    }
    let old = std::mem::take(&mut p.tensors);
    p.tensors = old.into_iter().zip(dead).filter(|(_, &d)| !d).map(|(t, _)| t).collect();
    for t in &mut p.tensors {
        if let Storage::Alias { of } = &mut t.storage {
            *of = new_id[*of];
        }
    }
    for k in &mut p.kernels {
        for a in &mut k.args {
            *a = new_id[*a];
        }
    }
    for io in p.inputs.iter_mut().chain(p.outputs.iter_mut()) {
        io.tensor = new_id[io.tensor];
    }
}

/// Names the kernels `k<NNN>_<template>` (`LowerCtx::emit`'s scheme) by their position again;
/// names of another form are kept.
pub(super) fn renumber_kernels(p: &mut Program) {
    for (i, k) in p.kernels.iter_mut().enumerate() {
        let numbered = k
            .name
            .strip_prefix('k')
            .and_then(|r| r.strip_suffix(k.template.as_str()))
            .and_then(|r| r.strip_suffix('_'))
            .is_some_and(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()));
        let name = format!("k{i:03}_{}", k.template);
        if numbered && k.name != name {
            k.context.insert("name".into(), json!(name));
            k.name = name;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::ops::kernel::{Act, Conv2d, ConvGeom, Layout, Pool, PoolKind, Transpose};
    use crate::ir::Graph;
    use crate::lower::cuda::Arch;
    use crate::lower::cuda::CudaTarget;
    use crate::lower::ops::conv::tests::{render_all, G};
    use crate::lower::{lower, LowerOptions};

    fn lowered(g: &Graph) -> Program {
        let target = CudaTarget::new(Arch::Sm90);
        lower(g, &target, &LowerOptions { max_batch: 256, ..Default::default() }).expect("lowers")
    }

    /// The kernels' templates, every convolution kernel shown as "conv" (the library kernel's
    /// template name is the target's business).
    fn templates(p: &Program) -> Vec<&str> {
        p.kernels.iter().map(|k| if k.template.starts_with("conv2d") { "conv" } else { k.template.as_str() }).collect()
    }

    fn nchw(c: i64, h: i64, w: i64) -> Vec<Dim> {
        vec![Dim::sym("N"), Dim::known(c), Dim::known(h), Dim::known(w)]
    }

    fn to_nhwc() -> Box<dyn crate::ir::Op> {
        Box::new(Transpose { perm: vec![0, 2, 3, 1] })
    }

    fn conv(layout: Layout, stride: usize, pad: usize) -> Box<dyn crate::ir::Op> {
        let geom = ConvGeom { strides: [stride; 2], pads: [pad; 4], dilations: [1, 1], group: 1 };
        Box::new(Conv2d { layout, geom, act: Some(Act::Relu), pre_act: None })
    }

    /// The fp16 graph input `name` (no boundary cast).
    fn input_f16(b: &mut G, name: &str, shape: Vec<Dim>) -> usize {
        let v = b.value(name, DType::F16, shape);
        b.g.inputs.push(v);
        v
    }

    /// An fp16 constant (for the convolutions of fp16 graphs).
    fn konst_f16(b: &mut G, name: &str, shape: &[usize]) -> usize {
        let v = b.konst(name, shape, |i| (i % 3) as f32);
        let value = &mut b.g.values[v];
        value.konst = value.konst.as_ref().map(|k| std::sync::Arc::new(k.cast(DType::F16)));
        if let Some(ty) = value.ty.as_mut() {
            ty.dtype = DType::F16;
        }
        v
    }

    /// Invariants of a fused program: kernels numbered by position, every arena tensor used by a
    /// kernel, ids in range, the fused kernels' args consistent with their context.
    fn check_consistent(p: &Program) {
        for (i, k) in p.kernels.iter().enumerate() {
            assert_eq!(k.name, format!("k{i:03}_{}", k.template));
            assert_eq!(k.context["name"], json!(k.name));
            assert!(k.args.iter().all(|&t| t < p.tensors.len()));
            let descs = k.context["args"].as_array().expect("args");
            assert_eq!(descs.len(), k.args.len(), "{}", k.name);
            let typed: Vec<Json> = k.launcher_args.iter().map(LauncherArg::template_fields).collect();
            assert_eq!(&typed, descs, "{}: the template's args are the typed ones", k.name);
            for (slot, (d, &t)) in descs.iter().zip(&k.args).enumerate() {
                assert_eq!(d["index"], json!(slot));
                assert_eq!(d["name"], json!(p.tensors[t].name), "{} slot {slot}", k.name);
            }
        }
        for (t, d) in p.tensors.iter().enumerate() {
            if let Storage::Alias { of } = d.storage {
                assert!(of < p.tensors.len());
            }
            if matches!(d.storage, Storage::Arena { .. }) {
                assert!(p.kernels.iter().any(|k| k.args.contains(&t)), "tensor {} is unused", d.name);
            }
        }
        for io in p.inputs.iter().chain(&p.outputs) {
            assert_eq!(p.tensors[io.tensor].name, io.name);
        }
    }

    /// ResNet-50's stem as the optimiser leaves it: an fp32 NCHW input, a layout transform to
    /// NHWC, the 7x7 convolution on 3 channels (the tensor-core stem kernel on CUDA, see
    /// `ops::conv`: it reads the unpadded 3-channel NHWC input).
    fn resnet_stem() -> G {
        let mut b = G::new();
        let x = b.input("data", nchw(3, 224, 224));
        let t = b.node("to_nhwc", to_nhwc(), vec![Some(x)]);
        let w = b.konst("w", &[64, 7, 7, 3], |i| (i % 5) as f32);
        let y = b.node("conv0", conv(Layout::Nhwc, 2, 3), vec![Some(t), Some(w), None, None]);
        b.g.outputs.push(y);
        b
    }

    #[test]
    fn resnet_stem_reads_the_model_input() {
        let p = lowered(&resnet_stem().g);
        // Unfused: cast, transpose, conv, cast. The stem kernel reads the 3-channel tensor, so
        // the transform has nothing to pad, and the stem reads the fp32 NCHW input itself.
        assert_eq!(templates(&p), ["conv", "cast"]);
        check_consistent(&p);
        let k = &p.kernels[0];
        assert_eq!((k.template.as_str(), k.name.as_str()), ("conv2d_stem", "k000_conv2d_stem"));
        assert_eq!(k.node, "graph inputs, to_nhwc, conv0");
        let c = &k.context;
        assert_eq!(
            (c["x_nchw"].as_bool(), c["x_ctype"].as_str(), c["name"].as_str()),
            (Some(true), Some("float"), Some("k000_conv2d_stem"))
        );
        assert_eq!(k.facts, KernelFacts::Opaque, "its input is no longer an NHWC fp16 tensor");
        let src = &p.tensors[k.args[0]];
        assert_eq!((src.dtype, &src.storage), (DType::F32, &Storage::Input { index: 0 }));
        assert_eq!(src.shape, nchw(3, 224, 224));
        assert_eq!(k.launcher_args[0].dtype, DType::F32);
        assert_eq!(c["args"][0]["ctype"].as_str(), Some("float"));
        // Both intermediates (the fp16 copy and its NHWC transpose) are gone: input, flattened
        // weight, conv output, graph output. No patch matrix.
        let names: Vec<&str> = p.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["data", "w.stem160", "conv0.out", "conv0.out"]);
        render_fused(&p, "fuse_stem", "conv2d_stem");
    }

    #[test]
    fn nchw_convolution_stem_fuses_its_own_transforms() {
        // A convolution the optimiser left in NCHW transposes its input itself (ops::conv); the
        // 3x3 thin filter then takes the stem kernel, which reads the NCHW input instead.
        let mut b = G::new();
        let x = b.input("x", nchw(3, 32, 32));
        let w = b.konst("w", &[16, 3, 3, 3], |i| i as f32);
        let y = b.node("c", conv(Layout::Nchw, 1, 1), vec![Some(x), Some(w), None, None]);
        b.g.outputs.push(y);
        let p = lowered(&b.g);
        assert_eq!(templates(&p), ["conv", "transpose", "cast"]);
        assert_eq!(p.kernels[0].template, "conv2d_stem");
        check_consistent(&p);
        let c = &p.kernels[0].context;
        assert_eq!((c["x_nchw"].as_bool(), c["x_ctype"].as_str()), (Some(true), Some("float")));
        assert_eq!(p.tensors[p.kernels[0].args[0]].storage, Storage::Input { index: 0 });

        // A thin 1x1 NCHW convolution is padded instead: cast, transpose and pad fuse.
        let mut b = G::new();
        let x = b.input("x", nchw(3, 32, 32));
        let w = b.konst("w", &[16, 3, 1, 1], |i| i as f32);
        let y = b.node("c", conv(Layout::Nchw, 1, 0), vec![Some(x), Some(w), None, None]);
        b.g.outputs.push(y);
        let p = lowered(&b.g);
        assert_eq!(templates(&p), ["nchw_to_nhwc", "conv", "transpose", "cast"]);
        check_consistent(&p);
        let c = &p.kernels[0].context;
        assert_eq!((c["pixels"].as_str(), c["c_in"].as_i64(), c["c_out"].as_i64()), (Some("1024"), Some(3), Some(4)));
    }

    /// ResNet's stem and its 3x3/2 max pooling (NHWC, as the optimiser leaves them).
    fn resnet_stem_pool() -> (G, usize) {
        let mut b = resnet_stem();
        let y = b.g.outputs.pop().expect("the stem's output");
        let geom = ConvGeom { strides: [2, 2], pads: [1; 4], dilations: [1, 1], group: 1 };
        let pool = Pool { kind: PoolKind::Max, layout: Layout::Nhwc, kernel: [3, 3], geom, ceil_mode: false };
        let z = b.node("pool0", Box::new(pool), vec![Some(y)]);
        b.g.outputs.push(z);
        (b, y)
    }

    #[test]
    fn the_max_pool_after_a_stem_fuses_into_it() {
        let (b, _) = resnet_stem_pool();
        let p = lowered(&b.g);
        // Unfused: the stem (reading the NCHW input), the pooling, the output cast.
        assert_eq!(templates(&p), ["conv", "cast"]);
        check_consistent(&p);
        let k = &p.kernels[0];
        assert_eq!((k.template.as_str(), k.name.as_str()), ("conv2d_stem", "k000_conv2d_stem"));
        assert_eq!(k.node, "graph inputs, to_nhwc, conv0, pool0");
        let c = &k.context;
        let field = |f: &str| c[f].as_i64().unwrap_or_else(|| panic!("{f}"));
        assert_eq!((c["pool"].as_bool(), c["x_nchw"].as_bool()), (Some(true), Some(true)));
        // 7x8 pooled pixels from 15x17 stem pixels a tile (ops::conv::stem_pool_tile).
        assert_eq!(
            [
                "tile_p",
                "tile_q",
                "pool_tile_p",
                "pool_tile_q",
                "pool_p",
                "pool_q",
                "pool_kernel_h",
                "pool_stride_w",
                "pool_pad_h"
            ]
            .map(field),
            [15, 17, 7, 8, 56, 56, 3, 2, 1]
        );
        // And, for grids of fewer such tiles than SMs, 3x8 pooled pixels from 7x17 in one pass.
        assert_eq!(c["small_grid"].as_bool(), Some(true));
        assert_eq!(
            ["small_tile_p", "small_tile_q", "small_pool_tile_p", "small_pool_tile_q"].map(field),
            [7, 17, 3, 8]
        );
        // The stem's 112x112 map is gone: input, weights, the pooled output, the graph output.
        let names: Vec<&str> = p.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["data", "w.stem160", "pool0.out", "pool0.out"]);
        let out = &p.tensors[k.args[2]];
        assert_eq!(out.shape[1..], [56, 56, 64].map(Dim::known));
        assert_eq!(c["args"][2]["name"], json!(k.launcher_args[2].name));
        render_fused(&p, "fuse_stem_pool", "conv2d_stem");
    }

    #[test]
    fn a_stem_whose_output_has_a_second_reader_keeps_its_pool() {
        let (mut b, y) = resnet_stem_pool();
        b.g.outputs.push(y);
        let p = lowered(&b.g);
        assert_eq!(templates(&p), ["conv", "pool2d", "cast", "cast"]);
        assert_eq!(p.kernels[0].context.get("pool"), None);
        check_consistent(&p);
    }

    #[test]
    fn a_stem_with_a_second_reader_of_its_input_keeps_the_transform() {
        // The NHWC tensor is also a graph output: the layout kernel stays and the stem reads it.
        let mut b = resnet_stem();
        let t = b.g.nodes[0].outputs[0];
        b.g.outputs.push(t);
        let p = lowered(&b.g);
        assert_eq!(&templates(&p)[..2], ["nchw_to_nhwc", "conv"]);
        let stem = &p.kernels[1];
        assert_eq!((stem.context["x_nchw"].as_bool(), stem.context["x_ctype"].as_str()), (Some(false), Some("half")));
        assert!(matches!(&stem.facts, KernelFacts::StemConv(f) if f.x_slot == 0));
        check_consistent(&p);
    }

    #[test]
    fn cast_and_transpose_fuse_without_a_pad() {
        let mut b = G::new();
        let x = b.input("x", nchw(64, 8, 8));
        let t = b.node("t", to_nhwc(), vec![Some(x)]);
        let w = b.konst("w", &[32, 1, 1, 64], |_| 0.5);
        let y = b.node("c", conv(Layout::Nhwc, 1, 0), vec![Some(t), Some(w), None, None]);
        b.g.outputs.push(y);
        let p = lowered(&b.g);
        assert_eq!(templates(&p), ["nchw_to_nhwc", "conv", "cast"]);
        check_consistent(&p);
        let c = &p.kernels[0].context;
        assert_eq!((c["c_in"].as_i64(), c["c_out"].as_i64(), c["vec"].as_i64()), (Some(64), Some(64), Some(8)));
        assert_eq!((c["thin"].as_bool(), c["pixels"].as_str()), (Some(false), Some("64")));
        assert_eq!(p.tensors[p.kernels[0].args[1]].name, "t.out");
        render_fused(&p, "fuse_tiled", NCHW_TO_NHWC_TEMPLATE);
    }

    // The pad tests below use thin 1x1 convolutions: a thin filter wider than 1x1 takes the
    // im2col path (ops::conv), which reads the unpadded tensor and has no pad kernel to fuse.

    #[test]
    fn transpose_and_pad_fuse_on_an_fp16_input() {
        let mut b = G::new();
        let x = input_f16(&mut b, "x", nchw(3, 20, 20));
        let t = b.node("t", to_nhwc(), vec![Some(x)]);
        let w = konst_f16(&mut b, "w", &[8, 1, 1, 3]);
        let y = b.node("c", conv(Layout::Nhwc, 1, 0), vec![Some(t), Some(w), None, None]);
        b.g.outputs.push(y);
        let p = lowered(&b.g);
        assert_eq!(templates(&p), ["nchw_to_nhwc", "conv"]);
        check_consistent(&p);
        let c = &p.kernels[0].context;
        assert_eq!((c["src_ctype"].as_str(), c["pixels"].as_str()), (Some("half"), Some("400")));
        assert_eq!(p.kernels[0].node, "t, c");
        render_fused(&p, "fuse_half", NCHW_TO_NHWC_TEMPLATE);
    }

    #[test]
    fn a_second_reader_keeps_the_intermediate() {
        // The fp16 copy of x feeds two transforms: the cast stays; each transform fuses with its
        // pad.
        let mut b = G::new();
        let x = b.input("x", nchw(3, 16, 16));
        let w = b.konst("w", &[8, 1, 1, 3], |_| 1.0);
        for name in ["a", "b"] {
            let t = b.node(&format!("{name}.t"), to_nhwc(), vec![Some(x)]);
            let y = b.node(name, conv(Layout::Nhwc, 1, 0), vec![Some(t), Some(w), None, None]);
            b.g.outputs.push(y);
        }
        let p = lowered(&b.g);
        assert_eq!(templates(&p), ["cast", "nchw_to_nhwc", "conv", "nchw_to_nhwc", "conv", "cast", "cast"]);
        check_consistent(&p);
        assert_eq!(p.kernels[1].context["src_ctype"], "half");
        assert_eq!(p.kernels[1].args[0], p.kernels[0].args[1]);

        // The NHWC tensor is also read by another kernel (the graph output's cast): the cast and
        // the transform fuse (3 channels, no pad), the pad stays.
        let mut b = G::new();
        let x = b.input("x", nchw(3, 16, 16));
        let t = b.node("t", to_nhwc(), vec![Some(x)]);
        let w = b.konst("w", &[8, 1, 1, 3], |_| 1.0);
        let y = b.node("c", conv(Layout::Nhwc, 1, 0), vec![Some(t), Some(w), None, None]);
        b.g.outputs.extend([y, t]);
        let p = lowered(&b.g);
        assert_eq!(templates(&p), ["nchw_to_nhwc", "pad_channels", "conv", "cast", "cast"]);
        check_consistent(&p);
        let c = &p.kernels[0].context;
        assert_eq!((c["c_in"].as_i64(), c["c_out"].as_i64(), c["vec"].as_i64()), (Some(3), Some(3), Some(1)));
        render_fused(&p, "fuse_odd", NCHW_TO_NHWC_TEMPLATE);
    }

    #[test]
    fn a_graph_output_is_never_fused_away() {
        // fp16: the transform writes the caller's output buffer in place, and the pad reads it.
        let mut b = G::new();
        let x = input_f16(&mut b, "x", nchw(3, 16, 16));
        let t = b.node("t", to_nhwc(), vec![Some(x)]);
        let w = konst_f16(&mut b, "w", &[8, 1, 1, 3]);
        let y = b.node("c", conv(Layout::Nhwc, 1, 0), vec![Some(t), Some(w), None, None]);
        b.g.outputs.extend([y, t]);
        let p = lowered(&b.g);
        assert_eq!(templates(&p), ["transpose", "pad_channels", "conv"]);
        assert_eq!(p.tensors[p.kernels[0].args[1]].storage, Storage::Output { index: 1 });
        check_consistent(&p);
    }

    #[test]
    fn fusion_is_idempotent() {
        let mut p = lowered(&resnet_stem().g);
        let fused = p.clone();
        fuse_program(&mut p);
        assert_eq!(templates(&p), templates(&fused));
        assert_eq!(p.tensors.len(), fused.tensors.len());
        check_consistent(&p);
    }

    /// The fp16 transform → pad → conv program, unfused (lowered without `lower`).
    fn unfused_fp16_stem() -> Program {
        let mut b = G::new();
        let x = input_f16(&mut b, "x", nchw(3, 16, 16));
        let t = b.node("t", to_nhwc(), vec![Some(x)]);
        let w = konst_f16(&mut b, "w", &[8, 1, 1, 3]);
        b.node("c", conv(Layout::Nhwc, 1, 0), vec![Some(t), Some(w), None, None]);
        let p = crate::lower::ops::conv::tests::lower_with(&b.g, |cx, node| {
            let spec = crate::lower::ops::find(node).expect("a family lowers it");
            (spec.lower)(cx, node)
        })
        .expect("lowers");
        assert_eq!(templates(&p), ["transpose", "pad_channels", "conv"]);
        p
    }

    #[test]
    fn a_view_or_a_write_in_between_blocks_the_fusion() {
        let mut plain = unfused_fp16_stem();
        let tensors = plain.tensors.len();
        fuse_program(&mut plain);
        assert_eq!(templates(&plain), ["nchw_to_nhwc", "conv"]);
        assert_eq!(plain.tensors.len(), tensors - 1);
        check_consistent(&plain);

        // A view of the NHWC tensor: it must stay.
        let mut viewed = unfused_fp16_stem();
        let nhwc = viewed.kernels[0].args[1];
        let mut view = viewed.tensors[nhwc].clone();
        view.storage = Storage::Alias { of: nhwc };
        viewed.tensors.push(view);
        fuse_program(&mut viewed);
        assert_eq!(templates(&viewed), ["transpose", "pad_channels", "conv"]);

        // A kernel between the transform and the pad overwrites the transform's input: the fused
        // kernel, which runs at the pad's position, would read the new bytes.
        let mut overwritten = unfused_fp16_stem();
        let x = overwritten.kernels[0].args[0];
        let mut writer = overwritten.kernels[0].clone();
        writer.template = "fill".into();
        writer.args = vec![x];
        writer.writes = vec![0];
        overwritten.kernels.insert(1, writer);
        fuse_program(&mut overwritten);
        assert_eq!(templates(&overwritten), ["transpose", "fill", "pad_channels", "conv"]);
    }

    #[test]
    fn the_typed_facts_alone_decide_the_fusion() {
        let stem = unfused_fp16_stem();
        let (batches, rows, cols) = (Dim::sym("N"), Dim::known(3), Dim::known(256));
        assert_eq!(stem.kernels[0].facts, KernelFacts::TiledTranspose { batches, rows, cols });
        assert_eq!(stem.kernels[1].facts, KernelFacts::PadChannels { x_slot: 0, out_slot: 1, c_in: 3, c_out: 4 });
        let mut want = stem.clone();
        fuse_program(&mut want);

        // The transform's and the pad's template fields gone, `args` included: the same kernel.
        let mut blind = stem.clone();
        for k in &mut blind.kernels[..2] {
            k.context.clear();
        }
        fuse_program(&mut blind);
        assert_eq!(templates(&blind), ["nchw_to_nhwc", "conv"]);
        assert_eq!(blind.kernels[0].context, want.kernels[0].context);
        assert_eq!(blind.kernels[0].launcher_args, want.kernels[0].launcher_args);
        check_consistent(&blind);

        // The template fields without the facts: nothing fuses.
        let mut untyped = stem;
        for k in &mut untyped.kernels {
            k.facts = KernelFacts::Opaque;
        }
        fuse_program(&mut untyped);
        assert_eq!(templates(&untyped), ["transpose", "pad_channels", "conv"]);
    }

    /// Renders the fused kernels through the template on disk (`O2A_RENDER_DIR`: also written
    /// there with common.cuh, for nvcc).
    /// Renders the program's kernels of `template` (the fused ones): every field is filled.
    fn render_fused(p: &Program, model: &str, template: &str) {
        let mut q = p.clone();
        q.model_name = model.to_string();
        q.kernels.retain(|k| k.template == template);
        assert!(!q.kernels.is_empty(), "no {template} kernel to render");
        for (_, text) in render_all(&q) {
            assert!(!text.contains("{{"), "unrendered handlebars");
            assert!(text.contains("int k0"), "the launcher is defined");
        }
    }

    // ---- The kernel's index math on the CPU -------------------------------------------------

    /// `o2a_tile_word` of the template: word `w` (channels 2w, 2w+1) of tile pixel `p`.
    fn tile_word(p: usize, w: usize) -> usize {
        p * 16 + (w ^ ((p >> 1) & 15))
    }

    /// Runs the template's thread and tile index math for one (c_in, c_out, vec, thin)
    /// instance: the output, each element stored exactly once, at a `vec`-aligned offset.
    struct Sim<'a> {
        x: &'a [f32],
        y: Vec<Option<f32>>,
        pixels: usize,
        c_in: usize,
        c_out: usize,
        w: usize,
    }

    impl Sim<'_> {
        fn channel(&self, xb: usize, p: usize, c: usize) -> f32 {
            if c < self.c_in {
                self.x[xb + c * self.pixels + p]
            } else {
                0.0
            }
        }
        /// `o2a_store_group<W>`: channels [c, min(c + 8, c_out)) from the 8 values `q`.
        fn store_group(&mut self, at: usize, q: [f32; 8], c: usize) {
            let count = (self.c_out - c).min(8);
            for j in (0..8).step_by(self.w) {
                if j < count {
                    assert_eq!((at + j) % self.w, 0, "a {}-half store is misaligned", self.w);
                    for k in 0..self.w {
                        assert!(self.y[at + j + k].is_none(), "element {} stored twice", at + j + k);
                        self.y[at + j + k] = Some(q[j + k]);
                    }
                }
            }
        }
    }

    fn simulate(x: &[f32], batches: usize, pixels: usize, c_in: usize, c_out: usize) -> Vec<f32> {
        let w = store_width(c_out as i64) as usize;
        let mut s = Sim { x, y: vec![None; batches * pixels * c_out], pixels, c_in, c_out, w };
        for b in 0..batches {
            let (xb, yb) = (b * c_in * pixels, b * pixels * c_out);
            if c_out as i64 <= THIN_MAX_CHANNELS {
                for p in 0..pixels {
                    for c in (0..c_out).step_by(8) {
                        let q = std::array::from_fn(|k| s.channel(xb, p, c + k));
                        s.store_group(yb + p * c_out + c, q, c);
                    }
                }
                continue;
            }
            let (tile_c, tile_p, threads) = (32, 64, 256);
            for c0 in (0..c_out).step_by(tile_c) {
                for p0 in (0..pixels).step_by(tile_p) {
                    let mut tile: Vec<Option<[f32; 2]>> = vec![None; tile_c * tile_p / 2];
                    for i in 0..tile_c * tile_p / 2 / threads {
                        for t in 0..threads {
                            let e = i * threads + t;
                            let (wd, p) = (e / tile_p, e % tile_p);
                            let (pix, c) = (p0 + p, c0 + 2 * wd);
                            let pair = if pix < pixels {
                                [s.channel(xb, pix, c), s.channel(xb, pix, c + 1)]
                            } else {
                                [0.0; 2]
                            };
                            assert!(tile[tile_word(p, wd)].replace(pair).is_none(), "tile word written twice");
                        }
                    }
                    for t in 0..threads {
                        let (p, v) = (t / 4, t % 4);
                        let (pix, c) = (p0 + p, c0 + 8 * v);
                        if pix < pixels && c < c_out {
                            let q = std::array::from_fn(|k| tile[tile_word(p, 4 * v + k / 2)].expect("loaded")[k % 2]);
                            s.store_group(yb + pix * c_out + c, q, c);
                        }
                    }
                }
            }
        }
        s.y.into_iter().enumerate().map(|(i, v)| v.unwrap_or_else(|| panic!("element {i} never stored"))).collect()
    }

    #[test]
    fn kernel_index_math_matches_the_chain() {
        for &(batches, pixels, c_in, c_out) in &[
            (2, 50, 3, 8),
            (1, 7, 3, 3),
            (2, 9, 5, 6),
            (1, 10, 16, 16),
            (3, 130, 64, 64),
            (2, 100, 3, 40),
            (1, 65, 33, 33),
            (2, 64, 20, 24),
            (1, 3, 90, 96),
        ] {
            let x: Vec<f32> = (0..batches * c_in * pixels).map(|i| i as f32 + 1.0).collect();
            let mut want = vec![0.0; batches * pixels * c_out];
            for b in 0..batches {
                for c in 0..c_in {
                    for p in 0..pixels {
                        want[(b * pixels + p) * c_out + c] = x[(b * c_in + c) * pixels + p];
                    }
                }
            }
            assert_eq!(simulate(&x, batches, pixels, c_in, c_out), want, "{batches}x{c_in}x{pixels} -> {c_out}");
        }
    }

    #[test]
    fn tile_accesses_are_free_of_bank_conflicts() {
        let banks = |words: Vec<usize>| {
            let mut b: Vec<usize> = words.iter().map(|w| w % 32).collect();
            b.sort();
            b.dedup();
            b.len()
        };
        for warp in 0..8 {
            let lanes = warp * 32..warp * 32 + 32;
            // Load phase i: lane t stores word e / 64 of pixel e % 64.
            for i in 0..4 {
                let words = lanes.clone().map(|t| (i * 256 + t) % 64).zip(lanes.clone().map(|t| (i * 256 + t) / 64));
                assert_eq!(banks(words.map(|(p, w)| tile_word(p, w)).collect()), 32);
            }
            // Store phase, word k of lane t's 16 bytes.
            for k in 0..4 {
                assert_eq!(banks(lanes.clone().map(|t| tile_word(t / 4, 4 * (t % 4) + k)).collect()), 32);
            }
        }
    }
}
