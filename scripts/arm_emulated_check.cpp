// A few of the C++ kernels' ops against plain ATen references, built for aarch64 and run under
// qemu-user by scripts/arm_emulated_check.py. A C++ program rather than Python: the aarch64 torch
// wheel on PyPI is a CUDA build, whose Python module does not import without the CUDA libraries;
// this needs only libtorch_cpu (and the two CUDA libraries it names: cudart, cupti).
//
//   arm_emulated_check KERNELS.so
//
// Prints one line per check; exits 1 if any fails.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <dlfcn.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace {

c10::OperatorHandle op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow((std::string("lmiserve_cpu::") + name).c_str(), "");
}

std::vector<c10::IValue> call(const char* name, std::vector<c10::IValue> args) {
  auto handle = op(name);
  torch::jit::Stack stack(std::move(args));
  handle.callBoxed(&stack);
  return stack;
}

bool close(const at::Tensor& got, const at::Tensor& want, double atol, double rtol, std::string& why) {
  auto g = got.to(at::kDouble), w = want.to(at::kDouble);
  const double err = (g - w).abs().max().item<double>();
  const bool ok = at::allclose(g, w, rtol, atol);
  why = "max abs error " + std::to_string(err);
  return ok;
}

// rms_norm: y = w * round(x * rsqrt(mean(x^2) + eps)), in bf16
bool check_rms_norm(std::string& why) {
  auto x = at::randn({3, 64}).to(at::kBFloat16), w = at::randn({64}).to(at::kBFloat16);
  auto out = call("rms_norm", {x, w, 1e-6});
  auto xf = x.to(at::kFloat);
  auto want = w.to(at::kFloat) * (xf * at::rsqrt(xf.pow(2).mean({-1}, true) + 1e-6));
  return close(out[0].toTensor(), want, 2e-2, 2e-2, why);
}

// swiglu: silu(gate) * up over the two halves of the last dimension
bool check_swiglu(std::string& why) {
  auto gu = at::randn({2, 128}).to(at::kBFloat16);
  auto out = call("swiglu", {gu})[0].toTensor();
  auto f = gu.to(at::kFloat);
  auto gate = f.narrow(-1, 0, 64), up = f.narrow(-1, 64, 64);
  return close(out, gate * at::sigmoid(gate) * up, 2e-2, 2e-2, why);
}

// write_kv_: rows of k and v into the cache slots named by slot_mapping
bool check_write_kv(std::string& why) {
  auto kc = at::zeros({4, 16, 2, 32}, at::kBFloat16), vc = at::zeros({4, 16, 2, 32}, at::kBFloat16);
  auto k = at::randn({5, 2, 32}).to(at::kBFloat16), v = at::randn({5, 2, 32}).to(at::kBFloat16);
  auto slots = at::tensor(std::vector<int64_t>{3, 17, 40, 63, 0});
  call("write_kv_", {k, v, kc, vc, slots});
  auto wk = at::zeros_like(kc), wv = at::zeros_like(vc);
  wk.view({-1, 2, 32}).index_copy_(0, slots, k);
  wv.view({-1, 2, 32}).index_copy_(0, slots, v);
  return close(kc, wk, 0, 0, why) && close(vc, wv, 0, 0, why);
}

// paged_attention_decode: one query per sequence over its paged K/V, against dense softmax
// attention in fp64 over the same bf16 keys and values
bool check_decode(std::string& why, int64_t window) {
  const int64_t bs = 16, kvh = 2, heads = 4, dim = 64, nblocks = 12;
  const std::vector<int64_t> lengths = {1, 17, 40};
  auto kc = at::randn({nblocks, bs, kvh, dim}).to(at::kBFloat16), vc = at::randn({nblocks, bs, kvh, dim}).to(at::kBFloat16);
  auto order = at::randperm(nblocks, at::kLong);
  auto tables = at::zeros({3, 3}, at::kInt);
  int64_t next = 0;
  for (size_t s = 0; s < lengths.size(); ++s)
    for (int64_t b = 0; b < (lengths[s] + bs - 1) / bs; ++b) tables[s][b] = order[next++].item<int64_t>();
  auto q = at::randn({3, heads, dim}).to(at::kBFloat16);
  auto lens = at::tensor(std::vector<int32_t>{1, 17, 40});
  const double scale = 1.0 / std::sqrt(double(dim));
  auto out = call("paged_attention_decode", {q, kc, vc, tables, lens, scale, window, 0.0})[0].toTensor();
  bool ok = true;
  for (size_t s = 0; s < lengths.size(); ++s) {
    const int64_t n = lengths[s];
    std::vector<int64_t> slot;
    for (int64_t p = 0; p < n; ++p) slot.push_back(tables[s][p / bs].item<int64_t>() * bs + p % bs);
    auto idx = at::tensor(slot);
    auto k = kc.view({-1, kvh, dim}).index_select(0, idx).to(at::kDouble);
    auto v = vc.view({-1, kvh, dim}).index_select(0, idx).to(at::kDouble);
    const int64_t lo = window ? std::max<int64_t>(0, n - window) : 0;
    auto want = at::empty({heads, dim}, at::kDouble);
    for (int64_t h = 0; h < heads; ++h) {
      auto kh = k.select(1, h / (heads / kvh)).narrow(0, lo, n - lo), vh = v.select(1, h / (heads / kvh)).narrow(0, lo, n - lo);
      auto scores = at::mv(kh, q[s][h].to(at::kDouble)) * scale;
      want[h] = at::mv(vh.t(), at::softmax(scores, 0));
    }
    std::string w;
    ok = close(out[s], want, 4e-3, 8e-3, w) && ok;
    why += (s ? "; " : "") + w;
  }
  return ok;
}

// linear_gguf (Q4_0, Q8_0): random blocks (an fp16 scale and the quants), against F.linear over
// the weights they dequantize to, as BlockWeight.dequantize does
bool check_gguf(std::string& why, int64_t kind, at::ScalarType dtype) {
  const int64_t n = 11, k = 96, nb = k / 32;
  auto d = (at::rand({n, nb, 1}) * 0.05 + 0.01).to(at::kHalf);
  at::Tensor quants, w;
  if (kind == 2) {  // Q8_0
    quants = at::randint(-127, 128, {n, nb, 32}, at::kChar);
    w = d.to(at::kFloat) * quants.to(at::kFloat);
  } else {  // Q4_0: byte j holds quant j (low nibble) and j + 16 (high nibble)
    quants = at::randint(0, 256, {n, nb, 16}, at::kByte);
    auto q = at::cat({quants.bitwise_and(0xF), quants.bitwise_right_shift(4)}, -1).to(at::kFloat);
    w = d.to(at::kFloat) * (q - 8);
  }
  auto blocks = at::cat({d.view(at::kByte), quants.view(at::kByte)}, -1).reshape({n, -1}).contiguous();
  auto packed = call("pack_gguf", {blocks, kind, k})[0].toTensor();
  auto x = at::randn({3, k}).to(dtype);
  auto bias = at::randn({n});
  auto got = call("linear_gguf", {x, packed, kind, bias, int64_t(4)})[0].toTensor();
  auto want = at::linear(x.to(at::kDouble), w.reshape({n, k}).to(at::kDouble), bias.to(at::kDouble));
  const bool f32 = dtype == at::kFloat;
  return got.scalar_type() == dtype && close(got, want, f32 ? 1e-4 : 5e-2, f32 ? 1e-5 : 2e-2, why);
}

// argmax_logsumexp: each row's argmax and logsumexp
bool check_argmax_logsumexp(std::string& why) {
  auto logits = at::randn({2, 1000});
  auto out = call("argmax_logsumexp", {logits});
  const bool same = at::equal(out[0].toTensor().to(at::kLong).flatten(), logits.argmax(-1).flatten());
  return same && close(out[1].toTensor().flatten(), at::logsumexp(logits, {-1}).flatten(), 1e-4, 1e-5, why);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s KERNELS.so\n", argv[0]);
    return 2;
  }
  if (!dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL)) {
    std::printf("FAIL load %s: %s\n", argv[1], dlerror());
    return 1;
  }
  std::printf("ok    load %s\n", argv[1]);
  at::manual_seed(0);
  const std::vector<std::pair<std::string, std::function<bool(std::string&)>>> checks = {
      {"rms_norm (bf16)", check_rms_norm},
      {"swiglu (bf16)", check_swiglu},
      {"write_kv_ (bf16)", check_write_kv},
      {"paged_attention_decode (bf16)", [](std::string& w) { return check_decode(w, 0); }},
      {"paged_attention_decode (bf16, window 20)", [](std::string& w) { return check_decode(w, 20); }},
      {"linear_gguf Q4_0 (fp32 x)", [](std::string& w) { return check_gguf(w, 0, at::kFloat); }},
      {"linear_gguf Q8_0 (fp32 x)", [](std::string& w) { return check_gguf(w, 2, at::kFloat); }},
      {"linear_gguf Q4_0 (bf16 x)", [](std::string& w) { return check_gguf(w, 0, at::kBFloat16); }},
      {"linear_gguf Q8_0 (bf16 x)", [](std::string& w) { return check_gguf(w, 2, at::kBFloat16); }},
      {"argmax_logsumexp (fp32)", check_argmax_logsumexp},
  };
  int failed = 0;
  for (const auto& [name, check] : checks) {
    std::string why;
    bool ok = false;
    try {
      ok = check(why);
    } catch (const std::exception& e) {
      why = std::string("exception: ") + e.what();
      why = why.substr(0, why.find('\n'));
    }
    std::printf("%s %s: %s\n", ok ? "ok   " : "FAIL ", name.c_str(), why.c_str());
    std::fflush(stdout);
    failed += !ok;
  }
  std::printf("%d of %zu checks failed\n", failed, checks.size());
  return failed ? 1 : 0;
}
