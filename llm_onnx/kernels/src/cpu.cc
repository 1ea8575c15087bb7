// Run-time CPU dispatch: CPUID for the instructions, XGETBV for the operating system saving the
// registers they use. Nothing here is compiled with wider instructions than the baseline.
#include "cpu.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#if LLM_ONNX_X86
#if defined(_MSC_VER)
#include <intrin.h>
#else
#include <cpuid.h>
#endif
#endif

namespace llm_onnx_kernels {

namespace {

#if LLM_ONNX_X86
void cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
#if defined(_MSC_VER)
  int v[4];
  __cpuidex(v, static_cast<int>(leaf), static_cast<int>(sub));
  for (int i = 0; i < 4; ++i) r[i] = static_cast<uint32_t>(v[i]);
#else
  __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
#endif
}

uint64_t xgetbv0() {
#if defined(_MSC_VER)
  return _xgetbv(0);
#else
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
#endif
}

struct Features {
  bool avx2 = false, avxvnni = false, avx512vnni = false;
};

Features detect() {
  Features f;
  uint32_t r[4];
  cpuid(0, 0, r);
  const uint32_t max_leaf = r[0];
  if (max_leaf < 7) return f;
  cpuid(1, 0, r);
  const bool osxsave = (r[2] >> 27) & 1, fma = (r[2] >> 12) & 1;
  if (!osxsave) return f;
  const uint64_t xcr0 = xgetbv0();
  const bool ymm = (xcr0 & 0x6) == 0x6;      // SSE and AVX state
  const bool zmm = (xcr0 & 0xE6) == 0xE6;    // plus opmask and the upper ZMM registers
  cpuid(7, 0, r);
  const uint32_t ebx = r[1], ecx = r[2];
  const bool avx2 = (ebx >> 5) & 1;
  f.avx2 = ymm && avx2 && fma;
  const bool avx512 = ((ebx >> 16) & 1) && ((ebx >> 30) & 1) && ((ebx >> 31) & 1);  // F BW VL
  f.avx512vnni = f.avx2 && zmm && avx512 && ((ecx >> 11) & 1);
  cpuid(7, 1, r);
  f.avxvnni = f.avx2 && ((r[0] >> 4) & 1);
  return f;
}
#endif

std::string build_list() {
  std::string s;
#if LLM_ONNX_X86
  const Features f = detect();
  if (f.avx512vnni) s += "avx512vnni,";
  if (f.avxvnni) s += "avxvnni,";
  if (f.avx2) s += "avx2,";
#endif
  return s + "portable";
}

// kernels created per path, in the order of choose_isa's table
std::atomic<long> created[4];

}  // namespace

const char* supported_isas() {
  static const std::string list = build_list();
  return list.c_str();
}

bool choose_isa(const std::string& wanted, Isa* isa, std::string* error) {
  static const Isa all[] = {
#if LLM_ONNX_X86
      {"avx512vnni", block_dots_avx512vnni},
      {"avxvnni", block_dots_avxvnni},
      {"avx2", block_dots_avx2},
#endif
      {"portable", block_dots_portable},
  };
  const std::string have = std::string(",") + supported_isas() + ",";
  for (const Isa& candidate : all) {
    std::atomic<long>& count = created[&candidate - all];
    const bool on_machine = have.find("," + std::string(candidate.name) + ",") != std::string::npos;
    if ((wanted.empty() || wanted == "auto") && on_machine) {
      *isa = candidate;
      ++count;
      return true;
    }
    if (wanted == candidate.name) {
      if (!on_machine) {
        *error = "LLM_ONNX_KERNELS_ISA=" + wanted + ": this CPU lacks it (it has " +
                 supported_isas() + ")";
        return false;
      }
      *isa = candidate;
      ++count;
      return true;
    }
  }
  *error = "LLM_ONNX_KERNELS_ISA=" + wanted + " is unknown (known: auto, avx512vnni, avxvnni, " +
           "avx2, portable; this CPU has " + supported_isas() + ")";
  return false;
}

long kernels_created(const char* name) {
  static const char* const names[] = {
#if LLM_ONNX_X86
      "avx512vnni", "avxvnni", "avx2",
#endif
      "portable"};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); ++i)
    if (std::strcmp(names[i], name) == 0) return created[i].load();
  return -1;
}

}  // namespace llm_onnx_kernels
