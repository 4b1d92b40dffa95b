#pragma once
// flashattn: exact attention computed the IO-aware way (FlashAttention) in header-only C++17.
// This umbrella header brings in the whole public API: the forward and backward entry points, views,
// options, masks and variants, the CPU backend's context, and byte accounting, and the definitions of the
// 16-bit element types (Eigen::half, Eigen::bfloat16, from <Eigen/Core>; the other headers only declare
// them, so a program that includes them alone must include <Eigen/Core> to make such arrays). Not
// included: the Eigen convenience layer (flashattn/eigen.hpp) and the naive reference
// (flashattn/reference/). docs/architecture.md shows how the headers are layered.

#include <Eigen/Core>

#include "flashattn/backward.hpp"
#include "flashattn/combine.hpp"
#include "flashattn/core/block_mask.hpp"
#include "flashattn/core/errors.hpp"
#include "flashattn/core/fused_qkv.hpp"
#include "flashattn/core/masks.hpp"
#include "flashattn/core/options.hpp"
#include "flashattn/core/score_variants.hpp"
#include "flashattn/core/variants.hpp"
#include "flashattn/core/views.hpp"
#include "flashattn/cpu/build_info.hpp"
#include "flashattn/cpu/context.hpp"
#include "flashattn/cpu/tiles.hpp"
#include "flashattn/forward.hpp"
#include "flashattn/instrument/accounting.hpp"
#include "flashattn/kv_cache.hpp"
#include "flashattn/varlen.hpp"
#include "flashattn/version.hpp"
