// Shared by the translation units of libexpanse_simcuda.so.
#pragma once

namespace expanse::sim::exported {

// Configures the library's sim from EXPANSE_CONF on first use, unless expanse_sim_configure()
// already did. A bad EXPANSE_CONF is reported on stderr and leaves a sim with no devices (cuInit
// then answers CUDA_ERROR_NO_DEVICE).
void ensure_configured() noexcept;

}  // namespace expanse::sim::exported
