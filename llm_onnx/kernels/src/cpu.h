// Which instruction sets this CPU (and its operating system) supports, and the block_dots to
// use: the best one, or the one LLM_ONNX_KERNELS_ISA names (tests force each in turn).
#pragma once

#include <string>

#include "dot.h"

namespace llm_onnx_kernels {

struct Isa {
  const char* name;
  BlockDots dots;
};

// The instruction sets this library was built with and this machine runs, best first,
// separated by commas (e.g. "avx512vnni,avxvnni,avx2,portable").
const char* supported_isas();

// The ISA named by `wanted` ("" or "auto": the best supported). Returns false and sets `error`
// when the name is unknown or the machine lacks it.
bool choose_isa(const std::string& wanted, Isa* isa, std::string* error);

// How many kernels were created with the path `name` so far in this process (tests check that
// forcing a path takes it).
long kernels_created(const char* name);

}  // namespace llm_onnx_kernels
