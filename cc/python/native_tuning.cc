#include "cc/python/native_tuning.h"

#include <nanobind/stl/string.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cc/device/device_tuning.h"
#include "cc/ffi/collectives/collective_tuning.h"
#include "cc/ffi/gpu/gpu_tuning.h"
#include "cc/transport/spin_policy.h"

namespace nb = nanobind;

namespace hetjax::python {
namespace {

// Every layer's tuning, as the knob table reads and writes it.
struct Knobs {
  uint64_t spin_us = static_cast<uint64_t>(DefaultSpinBudget().count());
  device::DeviceTuning device;
  gpu::GpuTuning gpu;
  collectives::CollectiveTuning collectives;
};

Knobs InForce() {
  Knobs knobs;
  knobs.spin_us = static_cast<uint64_t>(SpinBudget().count());
  knobs.device = device::GetDeviceTuning();
  knobs.gpu = gpu::GetGpuTuning();
  knobs.collectives = collectives::GetCollectiveTuning();
  return knobs;
}

void SetInForce(const Knobs& knobs) {
  SetSpinBudget(std::chrono::microseconds(knobs.spin_us));
  device::SetDeviceTuning(knobs.device);
  gpu::SetGpuTuning(knobs.gpu);
  collectives::SetCollectiveTuning(knobs.collectives);
}

// One knob under its Python name (a field of hetjax.bridge.BridgeTuning).
struct Knob {
  const char* name;
  std::function<void(Knobs&, nb::handle)> set;
  std::function<nb::object(Knobs&)> get;
};

// A knob that is one field of a layer's tuning, of the matching Python type
// (int or bool).
template <typename T>
Knob Field(const char* name, T& (*field)(Knobs&)) {
  return {name,
          [field](Knobs& knobs, nb::handle value) {
            field(knobs) = nb::cast<T>(value);
          },
          [field](Knobs& knobs) { return nb::cast(field(knobs)); }};
}

// HETJAX_FLAG_SIGNAL's words for DeviceTuning::signal_flags_from_host.
Knob FlagSignal() {
  return {"flag_signal",
          [](Knobs& knobs, nb::handle value) {
            const std::string how = nb::cast<std::string>(value);
            if (how != "kernel" && how != "host") throw nb::cast_error();
            knobs.device.signal_flags_from_host = how == "host";
          },
          [](Knobs& knobs) {
            return nb::cast(knobs.device.signal_flags_from_host ? "host"
                                                                : "kernel");
          }};
}

const std::vector<Knob>& Table() {
  static const auto* table = new std::vector<Knob>{
      Field(
          "spin_us", +[](Knobs& k) -> uint64_t& { return k.spin_us; }),
      Field(
          "host_copy_threads",
          +[](Knobs& k) -> int& { return k.device.host_copy_threads; }),
      Field(
          "host_copy_nt",
          +[](Knobs& k) -> bool& { return k.device.host_copy_streaming; }),
      Field(
          "peer_copy_blocks",
          +[](Knobs& k) -> uint32_t& { return k.device.peer_copy_blocks; }),
      FlagSignal(),
      Field(
          "gpu_fused_bytes",
          +[](Knobs& k) -> uint64_t& { return k.gpu.fused_max_bytes; }),
      Field(
          "gpu_pair", +[](Knobs& k) -> bool& { return k.gpu.pair_exchange; }),
      Field(
          "gpu_pair_host",
          +[](Knobs& k) -> bool& { return k.gpu.pair_exchange_over_host; }),
      Field(
          "gpu_pair_chunk_bytes",
          +[](Knobs& k) -> uint64_t& { return k.gpu.pair_chunk_bytes; }),
      Field(
          "gpu_pair_copies",
          +[](Knobs& k) -> bool& { return k.gpu.pair_copies_over_host; }),
      Field(
          "gpu_piece_bytes",
          +[](Knobs& k) -> uint64_t& { return k.collectives.piece_bytes; }),
      Field(
          "gpu_round_lanes",
          +[](Knobs& k) -> int& { return k.collectives.round_lanes; }),
  };
  return *table;
}

const Knob* Find(const std::string& name) {
  for (const Knob& knob : Table()) {
    if (name == knob.name) return &knob;
  }
  return nullptr;
}

std::string KnownNames() {
  std::string names;
  for (const Knob& knob : Table()) {
    names += (names.empty() ? "" : ", ") + std::string(knob.name);
  }
  return names;
}

nb::dict ToDict(Knobs knobs) {
  nb::dict out;
  for (const Knob& knob : Table()) out[knob.name] = knob.get(knobs);
  return out;
}

}  // namespace

void ApplyTuning(const nb::dict& given) {
  Knobs knobs;
  for (auto [key, value] : given) {
    const std::string name = nb::cast<std::string>(key);
    const Knob* knob = Find(name);
    if (knob == nullptr) {
      throw nb::key_error(
          ("tuning knob " + name + ": this native module knows " + KnownNames())
              .c_str());
    }
    try {
      knob->set(knobs, value);
    } catch (const nb::cast_error&) {
      const std::string got = nb::cast<std::string>(nb::repr(value));
      const std::string expected =
          nb::cast<std::string>(nb::repr(knob->get(knobs)));
      throw nb::type_error(("tuning knob " + name + ": expected a value like " +
                            expected + ", got " + got)
                               .c_str());
    }
  }
  SetInForce(knobs);
}

nb::dict TuningInForce() { return ToDict(InForce()); }

nb::dict DefaultTuning() { return ToDict(Knobs()); }

}  // namespace hetjax::python
