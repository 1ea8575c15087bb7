// RoutedExperts: attributes and inputs read and checked, then experts.cc on ONNX Runtime's
// thread pool (KernelContext_ParallelFor); no threads of our own.
#include "routed_experts_op.h"

#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

namespace llm_onnx_kernels {

namespace {

constexpr size_t kX = 0, kIndex = 1, kWeight = 2, kGateUpCodes = 3, kGateUpScales = 4,
                 kDownCodes = 5, kDownScales = 6, kGateUpBias = 7, kDownBias = 8,
                 kGateUpZeroPoints = 9, kDownZeroPoints = 10;

struct Failure {
  std::string message;
};

template <typename T>
T attribute(const Ort::ConstKernelInfo& info, const char* name, T fallback) {
  try {
    return info.GetAttribute<T>(name);
  } catch (const Ort::Exception&) {
    return fallback;
  }
}

std::vector<int64_t> dims(const Ort::ConstValue& v) {
  return v.GetTensorTypeAndShapeInfo().GetShape();
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "(";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + ")";
}

// `v` has `want` as its leading dims and `elements` elements in all.
void expect(const char* name, const Ort::ConstValue& v, const std::vector<int64_t>& want,
            int64_t elements) {
  const std::vector<int64_t> got = dims(v);
  int64_t count = 1;
  for (int64_t x : got) count *= x;
  bool ok = got.size() >= want.size() && count == elements;
  for (size_t i = 0; ok && i < want.size(); ++i) ok = got[i] == want[i];
  if (!ok) {
    throw Failure{std::string("RoutedExperts: ") + name + " has shape " + shape_text(got) +
                  ", expected " + shape_text(want) + " leading and " + std::to_string(elements) +
                  " elements"};
  }
}

void trampoline(void* fn, size_t i) { (*static_cast<const std::function<void(size_t)>*>(fn))(i); }

}  // namespace

RoutedExpertsKernel::RoutedExpertsKernel(const OrtApi& api_, const OrtKernelInfo* info_ptr)
    : api(api_) {
  Ort::ConstKernelInfo info(info_ptr);
  bits = static_cast<int>(attribute<int64_t>(info, "bits", 4));
  block = static_cast<int>(attribute<int64_t>(info, "block_size", 32));
  const std::string act = attribute<std::string>(info, "activation", "swiglu");
  if (act == "geglu") {
    activation = Activation::kGeGLU;
  } else if (act != "swiglu") {
    throw Failure{"RoutedExperts: activation '" + act + "' is unknown (swiglu, geglu)"};
  }
  const std::string layout = attribute<std::string>(info, "gate_up_layout", "interleaved");
  if (layout != "interleaved" && layout != "halves")
    throw Failure{"RoutedExperts: gate_up_layout '" + layout + "' is unknown (interleaved, halves)"};
  interleaved = layout == "interleaved";
  alpha = attribute<float>(info, "alpha", 1.0f);
  beta = attribute<float>(info, "beta", 0.0f);
  limit = attribute<float>(info, "limit", INFINITY);
  const char* wanted = std::getenv("LLM_ONNX_KERNELS_ISA");
  std::string error;
  if (!choose_isa(wanted ? wanted : "", &isa, &error)) throw Failure{error};
}

OrtStatusPtr RoutedExpertsKernel::ComputeV2(OrtKernelContext* context_ptr) {
  try {
    Ort::KernelContext ctx(context_ptr);
    const Ort::ConstValue x = ctx.GetInput(kX), index = ctx.GetInput(kIndex);
    const Ort::ConstValue weight = ctx.GetInput(kWeight);
    const Ort::ConstValue gu_codes = ctx.GetInput(kGateUpCodes), gu_scales = ctx.GetInput(kGateUpScales);
    const Ort::ConstValue dn_codes = ctx.GetInput(kDownCodes), dn_scales = ctx.GetInput(kDownScales);
    const std::vector<int64_t> xs = dims(x), is = dims(index), gs = dims(gu_scales);
    if (xs.size() != 2 || is.size() != 2 || gs.size() != 3)
      throw Failure{"RoutedExperts: x and index must be 2-D, the scales 3-D"};
    ExpertsArgs a;
    a.tokens = xs[0], a.hidden = xs[1], a.top_k = is[1];
    a.experts = gs[0], a.width = gs[1] / 2;
    a.bits = bits, a.block = block, a.activation = activation, a.interleaved = interleaved;
    a.alpha = alpha, a.beta = beta, a.limit = limit;
    const int64_t e = a.experts, two_i = 2 * a.width, d = a.hidden, w = a.width;
    const int64_t kb1 = (d + block - 1) / block, kb2 = (w + block - 1) / block;
    expect("index", index, {a.tokens, a.top_k}, a.tokens * a.top_k);
    expect("weight", weight, {a.tokens, a.top_k}, a.tokens * a.top_k);
    expect("gate_up_scales", gu_scales, {e, two_i, kb1}, e * two_i * kb1);
    expect("gate_up_codes", gu_codes, {e, two_i}, e * two_i * kb1 * block * bits / 8);
    expect("down_scales", dn_scales, {e, d, kb2}, e * d * kb2);
    expect("down_codes", dn_codes, {e, d}, e * d * kb2 * block * bits / 8);
    a.x = x.GetTensorData<float>();
    a.index = index.GetTensorData<int64_t>();
    a.weight = weight.GetTensorData<float>();
    a.gate_up = {gu_codes.GetTensorData<uint8_t>(), gu_scales.GetTensorData<float>(), nullptr,
                 two_i, d};
    a.down = {dn_codes.GetTensorData<uint8_t>(), dn_scales.GetTensorData<float>(), nullptr, d, w};
    if (const Ort::ConstValue v = ctx.GetInput(kGateUpBias)) {
      expect("gate_up_bias", v, {e, two_i}, e * two_i);
      a.gate_up_bias = v.GetTensorData<float>();
    }
    if (const Ort::ConstValue v = ctx.GetInput(kDownBias)) {
      expect("down_bias", v, {e, d}, e * d);
      a.down_bias = v.GetTensorData<float>();
    }
    if (const Ort::ConstValue v = ctx.GetInput(kGateUpZeroPoints)) {
      expect("gate_up_zero_points", v, {e, two_i}, e * two_i * ((kb1 * bits + 7) / 8));
      a.gate_up.zero_points = v.GetTensorData<uint8_t>();
    }
    if (const Ort::ConstValue v = ctx.GetInput(kDownZeroPoints)) {
      expect("down_zero_points", v, {e, d}, e * d * ((kb2 * bits + 7) / 8));
      a.down.zero_points = v.GetTensorData<uint8_t>();
    }
    const std::string problem = check_args(a);
    if (!problem.empty()) throw Failure{"RoutedExperts: " + problem};
    a.out = ctx.GetOutput(0, xs).GetTensorMutableData<float>();
    const ParallelFor parallel_for = [&ctx](size_t total, const std::function<void(size_t)>& fn) {
      if (total == 1) {
        fn(0);
      } else if (total > 1) {
        ctx.ParallelFor(trampoline, total, 0, const_cast<std::function<void(size_t)>*>(&fn));
      }
    };
    run_experts(a, isa.dots, parallel_for);
    return nullptr;
  } catch (const Failure& f) {
    return api.CreateStatus(ORT_INVALID_ARGUMENT, f.message.c_str());
  } catch (const Ort::Exception& ex) {
    return api.CreateStatus(ex.GetOrtErrorCode(), ex.what());
  } catch (const std::exception& ex) {
    return api.CreateStatus(ORT_FAIL, ex.what());
  }
}

OrtStatusPtr RoutedExpertsOp::CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info,
                                             void** kernel) const {
  try {
    *kernel = new RoutedExpertsKernel(api, info);
    return nullptr;
  } catch (const Failure& f) {
    return api.CreateStatus(ORT_INVALID_ARGUMENT, f.message.c_str());
  } catch (const std::exception& ex) {
    return api.CreateStatus(ORT_FAIL, ex.what());
  }
}

ONNXTensorElementDataType RoutedExpertsOp::GetInputType(size_t index) const {
  switch (index) {
    case kIndex:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
    case kGateUpCodes:
    case kDownCodes:
    case kGateUpZeroPoints:
    case kDownZeroPoints:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
    default:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
}

OrtCustomOpInputOutputCharacteristic RoutedExpertsOp::GetInputCharacteristic(size_t index) const {
  return index >= kGateUpBias ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}

}  // namespace llm_onnx_kernels
