#include "cc/python/host_array.h"

#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>

namespace nb = nanobind;

namespace hetjax::python {
namespace {

DType DTypeFromName(const std::string& name) {
  // tensor_spec names dtypes the numpy way; asking it keeps one table.
  for (int code = 1; code <= static_cast<int>(DType::kBytes); ++code) {
    DType dtype = static_cast<DType>(code);
    if (name == DTypeName(dtype)) return dtype;
  }
  return DType::kInvalid;
}

}  // namespace

HostArray ViewHostArray(nb::handle array, bool writable, const char* what) {
  if (!nb::hasattr(array, "__array_interface__")) {
    throw nb::type_error((std::string(what) +
                          ": expected a numpy.ndarray, got " +
                          nb::cast<std::string>(nb::str(array.type())))
                             .c_str());
  }
  HostArray view;
  std::string dtype_name =
      nb::cast<std::string>(array.attr("dtype").attr("name"));
  view.spec.dtype = DTypeFromName(dtype_name);
  if (view.spec.dtype == DType::kInvalid || view.spec.dtype == DType::kBytes) {
    throw nb::type_error((std::string(what) + ": dtype " + dtype_name +
                          " cannot cross the bridge")
                             .c_str());
  }
  nb::tuple shape = nb::cast<nb::tuple>(array.attr("shape"));
  if (shape.size() > static_cast<size_t>(kMaxRank)) {
    throw nb::value_error((std::string(what) + ": rank " +
                           std::to_string(shape.size()) + " exceeds " +
                           std::to_string(kMaxRank))
                              .c_str());
  }
  view.spec.rank = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    view.spec.dims[i] = nb::cast<int64_t>(shape[i]);
  }
  if (!nb::cast<bool>(array.attr("flags").attr("c_contiguous"))) {
    throw nb::value_error((std::string(what) +
                           ": array must be C-contiguous (use "
                           "numpy.ascontiguousarray)")
                              .c_str());
  }
  nb::tuple data =
      nb::cast<nb::tuple>(array.attr("__array_interface__")["data"]);
  bool read_only = nb::cast<bool>(data[1]);
  if (writable && read_only) {
    throw nb::value_error(
        (std::string(what) + ": array is read-only, expected a writable one")
            .c_str());
  }
  view.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(data[0]));
  return view;
}

}  // namespace hetjax::python
