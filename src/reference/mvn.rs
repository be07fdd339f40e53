//! Reference kernel of the mvn family: MeanVarianceNormalization over a set of axes.

use ndarray::{ArrayD, Axis};

/// Epsilon of the ONNX function body of MeanVarianceNormalization (added to the standard
/// deviation, not to the variance).
pub const MVN_EPSILON: f64 = 1e-9;

/// `(x - mean) / (std + 1e-9)` with mean and (population) variance over `axes`, computed in
/// f64 as `mean((x - mean)^2)`, which never goes negative (the ONNX function's
/// `E[x^2] - E[x]^2` can, by rounding).
pub fn mvn(x: &ArrayD<f32>, axes: &[usize]) -> ArrayD<f32> {
    let xd = x.mapv(|v| v as f64);
    let count: usize = axes.iter().map(|&a| x.shape()[a]).product();
    let n = count.max(1) as f64;
    let reduce = |a: &ArrayD<f64>| {
        let mut r = a.clone();
        for &ax in axes {
            r = r.sum_axis(Axis(ax)).insert_axis(Axis(ax));
        }
        r.mapv(|v| v / n)
    };
    let mean = reduce(&xd);
    let centered = &xd - &mean;
    let var = reduce(&centered.mapv(|v| v * v));
    let denom = var.mapv(|v| v.sqrt() + MVN_EPSILON);
    (&centered / &denom).mapv(|v| v as f32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::IxDyn;

    #[test]
    fn normalises_each_group() {
        let x = ArrayD::from_shape_vec(IxDyn(&[2, 2]), vec![1.0f32, 3.0, 10.0, 10.0]).unwrap();
        let y = mvn(&x, &[1]);
        assert_eq!(y.iter().copied().collect::<Vec<_>>(), vec![-1.0, 1.0, 0.0, 0.0]);
    }
}
