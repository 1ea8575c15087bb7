// The library's entry points. ONNX Runtime calls RegisterCustomOps when a session options
// object registers this file (SessionOptions.register_custom_ops_library). The Python wheel
// links ONNX Runtime statically, so nothing here links libonnxruntime: the API table comes from
// the OrtApiBase handed in (ORT_API_MANUAL_INIT), at the version of the headers we were built
// with, which must not be newer than the runtime's.
#include <mutex>
#include <vector>

#include "routed_experts_op.h"

#if defined(_WIN32)
#define LLM_ONNX_EXPORT extern "C" __declspec(dllexport)
#else
#define LLM_ONNX_EXPORT extern "C" __attribute__((visibility("default")))
#endif

namespace {

// The operators' format: bumped when an operator's inputs or attributes change meaning, so the
// Python side can refuse a library older than the folders it loads.
constexpr const char* kOpsVersion = "1";

llm_onnx_kernels::RoutedExpertsOp routed_experts_op;

// Domains must outlive every session that uses them: kept until the process ends.
std::mutex domains_mutex;
std::vector<Ort::CustomOpDomain> domains;

}  // namespace

LLM_ONNX_EXPORT OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                          const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {  // version 1 of the API is in every release: enough to say why
    return api_base->GetApi(1)->CreateStatus(
        ORT_FAIL, "llm_onnx kernels: built against ONNX Runtime headers newer than this "
                  "onnxruntime; rebuild them (python -m llm_onnx.kernels build --force)");
  }
  Ort::InitApi(api);
  try {
    Ort::CustomOpDomain domain("llm_onnx");
    domain.Add(&routed_experts_op);
    Ort::UnownedSessionOptions(options).Add(domain);
    std::lock_guard<std::mutex> lock(domains_mutex);
    domains.push_back(std::move(domain));
  } catch (const Ort::Exception& e) {
    return api->CreateStatus(e.GetOrtErrorCode(), e.what());
  }
  return nullptr;
}

// What this machine's CPU offers of the instruction sets compiled in, best first
// ("avx512vnni,avxvnni,avx2,portable"): read by the Python side (ctypes) and the tests.
LLM_ONNX_EXPORT const char* llm_onnx_kernels_isas() { return llm_onnx_kernels::supported_isas(); }

LLM_ONNX_EXPORT const char* llm_onnx_kernels_ops_version() { return kOpsVersion; }

// Kernels created with the instruction-set path `name` in this process (-1: no such path).
LLM_ONNX_EXPORT long llm_onnx_kernels_created(const char* name) {
  return llm_onnx_kernels::kernels_created(name);
}
