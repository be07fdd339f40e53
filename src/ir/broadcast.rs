//! Numpy-style broadcasting and axis normalisation over (possibly symbolic) shapes.

use super::dim::{fmt_shape, Dim};
use super::op::{OpError, OpResult};

/// The broadcast of several shapes (numpy rules: align right, 1 stretches).
/// Two different symbolic dims are assumed equal only when they are the same expression.
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
            if *slot == one {
                *slot = d.clone();
            } else {
                let all: Vec<String> = shapes.iter().map(|s| fmt_shape(s)).collect();
                return Err(OpError(format!("shapes {} cannot be broadcast together", all.join(" and "))));
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
    }
}
