// Even placement of a grid smaller than one full wave (docs/kernels.md, "Grids below one full wave spread evenly").
// A grid of B blocks on S SMs whose blocks fit `occupancy` per SM by their other limits fills at most per = ceil(B / S)
// per SM when spread evenly; the block scheduler need not spread it so. Our reading (not traced): a grid launched early
// by PDL lands on the SMs that free up first, several blocks per SM, while other SMs stay idle (measured on the H200:
// 4096x4096 m = 16, BM16 split 8, 256 blocks, 14.5-15.0 us in some processes against 9.8 with this rule). So the launch
// asks for the smallest dynamic shared memory above its need at which per + 1 blocks no longer fit on an SM (per
// blocks still do). On by default; CUDA_EXL3_SPREAD=0 (or the old spelling VLLM_EXL3_SPREAD; exl3_kernels.env validates
// the value and warns about the old name) turns it off, read at each launch. With it on, GEMM grids below one block
// per SM also take PDL (ops.cpp, gemm_setup; the register-A launcher); with it off they launch without. Host only.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cctype>
#include <cstdlib>
#include <cstring>

namespace exl3 {

inline bool spread_on() {
  const char* e = std::getenv("CUDA_EXL3_SPREAD");
  if (e == nullptr) e = std::getenv("VLLM_EXL3_SPREAD");
  if (e == nullptr) return true;
  // off for the false spellings of exl3_kernels.env.get_bool (0 / false / no / off / empty, any case, surrounding
  // whitespace ignored as Python's strip() does); anything else is on (the Python wrappers refuse other values)
  while (*e != '\0' && std::isspace(static_cast<unsigned char>(*e))) ++e;
  char v[8] = {0};
  int n = 0;
  for (; n < 7 && e[n] != '\0'; ++n) v[n] = static_cast<char>(std::tolower(static_cast<unsigned char>(e[n])));
  if (e[n] != '\0' && !std::isspace(static_cast<unsigned char>(e[n]))) return true;  // longer than any off spelling
  while (n > 0 && std::isspace(static_cast<unsigned char>(v[n - 1]))) v[--n] = '\0';
  return !(v[0] == '\0' || !std::strcmp(v, "0") || !std::strcmp(v, "false") || !std::strcmp(v, "no") ||
           !std::strcmp(v, "off"));
}

struct DeviceSmem {
  int sms = 0, per_sm = 0, reserved = 0, optin = 0;
};

// SM count and shared memory limits of device `dev` (cached for devices 0..31: the three limits are stored first, then
// the SM count with release, which a reader loads with acquire before it reads the limits; racing first calls store
// equal values). All zero when the attributes cannot be read (then nothing is spread).
inline DeviceSmem device_smem(int dev) {
  static std::atomic<int> cached[32][4];
  if (dev >= 0 && dev < 32 && cached[dev][0].load(std::memory_order_acquire) > 0)
    return DeviceSmem{cached[dev][0].load(std::memory_order_relaxed), cached[dev][1].load(std::memory_order_relaxed),
                      cached[dev][2].load(std::memory_order_relaxed), cached[dev][3].load(std::memory_order_relaxed)};
  DeviceSmem d;
  if (cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&d.per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&d.reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&d.optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess || d.sms <= 0 ||
      d.optin <= 0)
    return DeviceSmem{};
  if (dev >= 0 && dev < 32) {
    cached[dev][1].store(d.per_sm, std::memory_order_relaxed);
    cached[dev][2].store(d.reserved, std::memory_order_relaxed);
    cached[dev][3].store(d.optin, std::memory_order_relaxed);
    cached[dev][0].store(d.sms, std::memory_order_release);
  }
  return d;
}

// Dynamic shared memory for a launch of `blocks` blocks needing `smem` bytes each (see the top of this file): `smem`
// unless spread_on() and per = ceil(blocks / SMs) < occupancy, else the smallest 128-byte multiple s >= smem with
// (per + 1) (s + reserved) > the SM's shared memory and per (s + reserved) <= it (`smem` when none exists, or when s
// would exceed `limit`, the dynamic shared memory the kernel's attribute allows: the value its launcher set with
// spread_optin). `occupancy` is the kernel's __launch_bounds__ minimum, a lower bound of what fits: a grid whose even
// share reaches it is left alone even where more blocks would fit.
inline int spread_smem(int smem, int64_t blocks, int occupancy, int dev, int limit) {
  if (!spread_on() || blocks <= 0) return smem;
  const DeviceSmem d = device_smem(dev);
  if (d.sms <= 0) return smem;
  const int64_t per = (blocks + d.sms - 1) / d.sms;
  if (per >= occupancy) return smem;
  int s = static_cast<int>(d.per_sm / (per + 1)) - d.reserved + 1;
  s = (s + 127) / 128 * 128;
  if (s <= smem || s > d.optin || s > limit || per * static_cast<int64_t>(s + d.reserved) > d.per_sm) return smem;
  return s;
}

// The dynamic shared memory opt-in a kernel is given once per device so that spread_smem's sizes can launch: the
// device's opt-in maximum (whatever the knob says now, as it is read at each launch), or `need` if that is larger.
inline int spread_optin(int need, int dev) {
  const DeviceSmem d = device_smem(dev);
  return d.optin > need ? d.optin : need;
}

}  // namespace exl3
