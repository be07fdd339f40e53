//! The reduce op family.

use super::OpSpec;

pub const OPS: &[OpSpec] = &[];
