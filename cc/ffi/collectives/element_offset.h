// Pointer arithmetic in elements of a DType, for the GPU collectives' buffers.
#pragma once

#include <cstddef>
#include <type_traits>

#include "cc/transport/tensor_spec.h"

namespace hetjax::collectives {

template <typename P>
P* Offset(P* base, size_t elements, DType dtype) {
  using Byte = std::conditional_t<std::is_const_v<P>, const char, char>;
  return reinterpret_cast<P*>(reinterpret_cast<Byte*>(base) +
                              elements * DTypeSize(dtype));
}

}  // namespace hetjax::collectives
