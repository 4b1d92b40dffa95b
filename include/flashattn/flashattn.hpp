#pragma once
// flashattn: exact attention computed the IO-aware way (FlashAttention) in header-only C++17.
// This umbrella header brings in the whole public API except the Eigen convenience layer
// (flashattn/eigen.hpp), which needs Eigen.

#include "flashattn/accounting.hpp"
#include "flashattn/attention.hpp"
#include "flashattn/backward.hpp"
#include "flashattn/errors.hpp"
#include "flashattn/masks.hpp"
#include "flashattn/options.hpp"
#include "flashattn/version.hpp"
#include "flashattn/views.hpp"
