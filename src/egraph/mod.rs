//! Equality-saturation optimiser (issue 4): the IR graph goes into an e-graph, phased rewriting
//! discovers fused kernels and layouts, DAG-aware extraction picks the cheapest graph.
