#include "cc/ffi/collectives/reduce_kernels.h"

#include <algorithm>
#include <complex>
#include <cstring>
#include <type_traits>

namespace hetjax::collectives {
namespace {

// Storage types for the two half formats; arithmetic never happens in them.
struct BF16 {
  uint16_t bits;
};
struct F16 {
  _Float16 value;
};

float ToFloat(BF16 x) {
  uint32_t bits = uint32_t{x.bits} << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}
float ToFloat(F16 x) { return static_cast<float>(x.value); }

// Round to nearest even, as XLA's convert does; NaN stays a (quiet) NaN.
BF16 ToBF16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return BF16{uint16_t((bits >> 16) | 0x40)};
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return BF16{uint16_t(bits >> 16)};
}
F16 ToF16(float x) { return F16{static_cast<_Float16>(x)}; }

// Integers add in their unsigned twin so overflow wraps instead of being UB.
template <typename T>
T Add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

// XLA's max/min propagate NaN; std::max would drop it depending on order.
template <typename T>
T Max(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return a < b ? b : a;
}
template <typename T>
T Min(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return b < a ? b : a;
}

template <typename T>
constexpr bool kIsComplex = std::is_same_v<T, std::complex<float>> ||
                            std::is_same_v<T, std::complex<double>>;

// Calls fn(T{}) with T the C++ storage type of `dtype`.
template <typename Fn>
void Dispatch(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kS8:
      return fn(int8_t{});
    case DType::kS16:
      return fn(int16_t{});
    case DType::kS32:
      return fn(int32_t{});
    case DType::kS64:
      return fn(int64_t{});
    case DType::kU8:
      return fn(uint8_t{});
    case DType::kU16:
      return fn(uint16_t{});
    case DType::kU32:
      return fn(uint32_t{});
    case DType::kU64:
      return fn(uint64_t{});
    case DType::kF16:
      return fn(F16{});
    case DType::kBF16:
      return fn(BF16{});
    case DType::kF32:
      return fn(float{});
    case DType::kF64:
      return fn(double{});
    case DType::kC64:
      return fn(std::complex<float>{});
    case DType::kC128:
      return fn(std::complex<double>{});
    default:
      return;  // rejected earlier by CheckReducible
  }
}

template <typename T>
constexpr bool kIsHalf = std::is_same_v<T, BF16> || std::is_same_v<T, F16>;

// The accumulator value of one stored element.
template <typename T>
auto Widen(T x) {
  if constexpr (kIsHalf<T>)
    return ToFloat(x);
  else
    return x;
}

}  // namespace

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "invalid";
}

DType AccumulatorDType(DType dtype) {
  return dtype == DType::kF16 || dtype == DType::kBF16 ? DType::kF32 : dtype;
}

Status CheckReducible(DType dtype, ReduceOp op, const char* what) {
  bool ok = false;
  switch (dtype) {
    case DType::kBool:
    case DType::kBytes:
    case DType::kInvalid:
      ok = false;
      break;
    case DType::kC64:
    case DType::kC128:
      ok = op == ReduceOp::kSum;
      break;
    default:
      ok = op == ReduceOp::kSum || op == ReduceOp::kMax || op == ReduceOp::kMin;
  }
  if (ok) return Status::Ok();
  return Status(StatusCode::kInvalidArgument,
                std::string(what) + ": cannot reduce " + DTypeName(dtype) +
                    " with op " + ReduceOpName(op) +
                    " (expected an integer or float dtype; complex only sums)");
}

void LoadAccumulator(DType in_dtype, const void* in, void* acc, size_t n) {
  Dispatch(in_dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = decltype(Widen(T{}));
    const T* src = static_cast<const T*>(in);
    A* dst = static_cast<A*>(acc);
    for (size_t i = 0; i < n; ++i) dst[i] = Widen(src[i]);
  });
}

void AccumulateInto(DType in_dtype, ReduceOp op, const void* in, void* acc,
                    size_t n) {
  Dispatch(in_dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = decltype(Widen(T{}));
    const T* src = static_cast<const T*>(in);
    A* dst = static_cast<A*>(acc);
    if (op == ReduceOp::kSum) {
      for (size_t i = 0; i < n; ++i) dst[i] = Add(dst[i], Widen(src[i]));
    } else if constexpr (!kIsComplex<A>) {
      if (op == ReduceOp::kMax) {
        for (size_t i = 0; i < n; ++i) dst[i] = Max(dst[i], Widen(src[i]));
      } else {
        for (size_t i = 0; i < n; ++i) dst[i] = Min(dst[i], Widen(src[i]));
      }
    }
  });
}

void StoreAccumulator(DType acc_dtype, const void* acc, DType out_dtype,
                      void* out, size_t n, double divisor) {
  Dispatch(acc_dtype, [&](auto tag) {
    using A = decltype(tag);
    if constexpr (kIsHalf<A>) {
      return;  // never an accumulator type
    } else {
      const A* src = static_cast<const A*>(acc);
      auto scaled = [&](A x) -> A {
        if constexpr (std::is_integral_v<A>)
          return x;
        else if constexpr (kIsComplex<A>)
          return divisor == 1.0 ? x : x / typename A::value_type(divisor);
        else
          return divisor == 1.0 ? x
                                : static_cast<A>(x / static_cast<A>(divisor));
      };
      if constexpr (std::is_same_v<A, float>) {
        if (out_dtype == DType::kBF16) {
          BF16* dst = static_cast<BF16*>(out);
          for (size_t i = 0; i < n; ++i) dst[i] = ToBF16(scaled(src[i]));
          return;
        }
        if (out_dtype == DType::kF16) {
          F16* dst = static_cast<F16*>(out);
          for (size_t i = 0; i < n; ++i) dst[i] = ToF16(scaled(src[i]));
          return;
        }
      }
      A* dst = static_cast<A*>(out);
      if (divisor == 1.0 && static_cast<const void*>(dst) == acc) return;
      for (size_t i = 0; i < n; ++i) dst[i] = scaled(src[i]);
    }
  });
}

}  // namespace hetjax::collectives
