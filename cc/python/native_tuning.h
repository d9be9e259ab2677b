// The native share of hetjax's bridge tuning (hetjax/bridge/tuning.py,
// BridgeTuning.native()): {knob name: value}, applied to every layer's
// tuning (spin_policy.h, device_tuning.h, gpu_tuning.h,
// collective_tuning.h) by the module's start, before the bridge runs.
// Python reads the environment and validates; this file only carries the
// values over, so no C++ layer reads a HETJAX_* variable.
#pragma once

#include <nanobind/nanobind.h>

namespace hetjax::python {

// Sets every layer's tuning to its defaults overridden by `knobs`, so that
// nothing of an earlier start lingers. Raises KeyError naming a knob this
// module does not know and TypeError for a value of the wrong type, before
// it sets anything. Call it only while no bridge runs.
void ApplyTuning(const nanobind::dict& knobs);

// {knob name: value} in force now, the defaults before any start.
nanobind::dict TuningInForce();

// {knob name: value} that hold unless a start sets them; machine-dependent
// ones (spin_us, host_copy_threads) as this machine has them.
nanobind::dict DefaultTuning();

}  // namespace hetjax::python
