// A numpy array seen as a bridge tensor: its TensorSpec and data pointer.
// Read through numpy's own attributes (dtype.name, shape,
// __array_interface__) rather than DLPack, because DLPack cannot describe
// ml_dtypes' bfloat16, which the bridge must carry.
#pragma once

#include <nanobind/nanobind.h>

#include "cc/transport/tensor_spec.h"

namespace hetjax::python {

struct HostArray {
  TensorSpec spec;
  void* data = nullptr;
};

// Raises TypeError/ValueError (nanobind exceptions) for arrays the bridge
// cannot carry: unknown dtype, rank above kMaxRank, not C-contiguous, or
// read-only when `writable` is required.
HostArray ViewHostArray(nanobind::handle array, bool writable,
                        const char* what);

}  // namespace hetjax::python
