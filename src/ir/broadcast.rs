//! Numpy-style broadcasting and axis normalisation over (possibly symbolic) shapes.

use super::dim::{fmt_shape, Dim};
use super::op::{OpError, OpResult};

/// The broadcast of several shapes (numpy rules: align right, 1 stretches).
/// A symbolic dim against a known size gives the known size (the symbol must be 1 or equal);
/// two different symbols give their `max`.
pub fn broadcast_shapes(shapes: &[&[Dim]]) -> OpResult<Vec<Dim>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let one = Dim::known(1);
    let mut out = vec![one.clone(); rank];
    for (axis, slot) in out.iter_mut().enumerate() {
        for s in shapes {
            let offset = rank - s.len();
            if axis < offset {
                continue;
            }
            let d = &s[axis - offset];
            if *d == one || d == slot {
                continue;
            }
            match (slot.as_known(), d.as_known()) {
                (Some(1), _) => *slot = d.clone(),
                (Some(_), Some(_)) => {
                    let all: Vec<String> = shapes.iter().map(|s| fmt_shape(s)).collect();
                    return Err(OpError(format!("shapes {} cannot be broadcast together", all.join(" and "))));
                }
                // A symbolic dim against a known one: the symbol must be 1 or equal to it, and
                // either way the result is the known size (checked again at run time).
                (None, Some(_)) => *slot = d.clone(),
                (Some(_), None) => {}
                // Two different symbols: the larger of the two, whatever they turn out to be.
                (None, None) => *slot = slot.max_dim(d),
            }
        }
    }
    Ok(out)
}

/// Same as `broadcast_shapes` on concrete shapes.
pub fn broadcast_usize(shapes: &[&[usize]]) -> OpResult<Vec<usize>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for (axis, slot) in out.iter_mut().enumerate() {
        for s in shapes {
            let offset = rank - s.len();
            if axis < offset {
                continue;
            }
            let d = s[axis - offset];
            if d == 1 || d == *slot {
                continue;
            }
            if *slot == 1 {
                *slot = d;
            } else {
                return Err(OpError(format!("shapes {shapes:?} cannot be broadcast together")));
            }
        }
    }
    Ok(out)
}

/// Maps an ONNX axis in `[-rank, rank)` to `[0, rank)`.
pub fn normalize_axis(axis: i64, rank: usize) -> OpResult<usize> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        return Err(OpError(format!("axis {axis} is out of range for rank {rank}")));
    }
    Ok(if axis < 0 { (axis + r) as usize } else { axis as usize })
}

/// Normalises a list of axes, rejecting duplicates.
pub fn normalize_axes(axes: &[i64], rank: usize) -> OpResult<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = normalize_axis(a, rank)?;
        if out.contains(&n) {
            return Err(OpError(format!("axis {a} is repeated in {axes:?}")));
        }
        out.push(n);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting() {
        let n = Dim::sym("N");
        let a = vec![n.clone(), Dim::known(3), Dim::known(1)];
        let b = vec![Dim::known(4)];
        assert_eq!(broadcast_shapes(&[&a, &b]).unwrap(), vec![n, Dim::known(3), Dim::known(4)]);
        let bad = broadcast_shapes(&[&[Dim::known(2), Dim::known(3)], &[Dim::known(4)]]).unwrap_err();
        assert!(bad.0.contains("[2,3] and [4]"), "{}", bad.0);
        let sym_vs_known = broadcast_shapes(&[&[Dim::sym("N")], &[Dim::known(4)]]).unwrap();
        assert_eq!(sym_vs_known, vec![Dim::known(4)]);
    }
}
