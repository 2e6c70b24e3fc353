// Even placement of a grid smaller than one full wave (an A/B knob: CUDA_EXL3_SPREAD=1, or its old spelling
// VLLM_EXL3_SPREAD; off by default). A grid of B blocks on S SMs whose blocks fit `occupancy` per SM by their other
// limits fills at most per = ceil(B / S) per SM when spread evenly; the block scheduler need not spread it so (a
// grid launched early by PDL lands on the SMs that free up first). With the knob on, the launch asks for the smallest
// dynamic shared memory above its need at which per + 1 blocks no longer fit on an SM (per blocks still do), so no SM
// can take more than per of them. Host only.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>

namespace exl3 {

inline bool spread_on() {
  static const bool on = [] {
    const char* e = std::getenv("CUDA_EXL3_SPREAD");
    if (e == nullptr) e = std::getenv("VLLM_EXL3_SPREAD");
    return e != nullptr && e[0] == '1';
  }();
  return on;
}

struct DeviceSmem {
  int sms = 0, per_sm = 0, reserved = 0, optin = 0;
};

// SM count and shared memory limits of device `dev` (cached for devices 0..31; a benign race stores equal values).
inline DeviceSmem device_smem(int dev) {
  static std::atomic<int> cached[32][4];
  if (dev >= 0 && dev < 32 && cached[dev][0].load(std::memory_order_relaxed) > 0)
    return DeviceSmem{cached[dev][0].load(std::memory_order_relaxed), cached[dev][1].load(std::memory_order_relaxed),
                      cached[dev][2].load(std::memory_order_relaxed), cached[dev][3].load(std::memory_order_relaxed)};
  DeviceSmem d;
  if (cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&d.per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&d.reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&d.optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
    return DeviceSmem{};
  if (dev >= 0 && dev < 32) {
    cached[dev][1].store(d.per_sm, std::memory_order_relaxed);
    cached[dev][2].store(d.reserved, std::memory_order_relaxed);
    cached[dev][3].store(d.optin, std::memory_order_relaxed);
    cached[dev][0].store(d.sms, std::memory_order_relaxed);
  }
  return d;
}

// Dynamic shared memory for a launch of `blocks` blocks needing `smem` bytes each (see the top of this file): `smem`
// unless spread_on() and per = ceil(blocks / SMs) < occupancy, else the smallest 128-byte multiple s >= smem with
// (per + 1) (s + reserved) > the SM's shared memory and per (s + reserved) <= it (`smem` when none exists).
inline int spread_smem(int smem, int64_t blocks, int occupancy, int dev) {
  if (!spread_on() || blocks <= 0) return smem;
  const DeviceSmem d = device_smem(dev);
  if (d.sms <= 0) return smem;
  const int64_t per = (blocks + d.sms - 1) / d.sms;
  if (per >= occupancy) return smem;
  int s = static_cast<int>(d.per_sm / (per + 1)) - d.reserved + 1;
  s = (s + 127) / 128 * 128;
  if (s <= smem || s > d.optin || per * static_cast<int64_t>(s + d.reserved) > d.per_sm) return smem;
  return s;
}

// The dynamic shared memory opt-in a kernel needs so that spread_smem's sizes can launch: `need` without the knob.
inline int spread_optin(int need, int dev) {
  if (!spread_on()) return need;
  const DeviceSmem d = device_smem(dev);
  return d.optin > need ? d.optin : need;
}

}  // namespace exl3
