// The int4 runtime's forward in one call: everything between the matmuls in compiled code.
//
// hartonomous/runtimes/int4.py holds the weights and the KV cache and calls `Forward.rows` (decoding,
// extend, extend_tree: one row at a time wherever rows could interact) and `Forward.chunks` (the
// prompt's chunks of batched attention). The matmuls stay torch's: at::_weight_int4pack_mm_for_cpu on
// the packed Q4_1 codes (bitwise the same for 1 row or many), the Q8_0 head as two of them, and, for
// the prompt's chunks, at::linear on the bfloat16 weights and at::scaled_dot_product_attention. The
// norms, the rotary embedding, the row attention over the cache, SiLU and the residuals are the loops
// below: each computes one row (one row and head for attention) alone, in a fixed order of
// operations that depends on nothing but that row's data, so a token's logits are bitwise the same
// decoded alone, in a chain or in a tree, and whatever the thread count.
//
// Determinism: built with -ffp-contract=off, so a product and a sum are fused only where std::fma
// says so, identically at every call site; reductions run in 16 fixed lanes, summed in a fixed tree.
// Cancel: between layers, at most every CANCEL_POLL_MS, the forward asks the Python callable it was
// given (under the GIL, which it otherwise releases) and stops with "cancelled" when it says so.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace py = pybind11;
using at::Tensor;
using bf16 = c10::BFloat16;

namespace {

constexpr int LANES = 16;
constexpr double CANCEL_POLL_MS = 10.0;
constexpr int64_t PARALLEL_KEYS = 4096;   // attention work (keys x heads) below which one thread does it

inline float lane_sum(float* acc) {
  for (int w = LANES / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

inline float dot(const float* a, const float* b, int64_t n) {   // n % LANES == 0
  float acc[LANES] = {0};
  for (int64_t d = 0; d < n; d += LANES)
    for (int l = 0; l < LANES; ++l) acc[l] = std::fma(a[d + l], b[d + l], acc[l]);
  return lane_sum(acc);
}

// exp(x) to ~2 ulp (Cephes' expf polynomial), branch-free so that loops of it vectorise.
inline float exp_approx(float x) {
  x = std::min(std::max(x, -87.3f), 88.3f);
  float n = std::floor(std::fma(x, 1.44269504088896341f, 0.5f));
  float r = std::fma(n, -0.693359375f, x);
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p * r, r, r) + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// y = x * rsqrt(mean(x^2) + eps) * w, rounded to bfloat16 (a matmul's input)
void rms_norm_bf16(const float* x, const float* w, int64_t dim, float eps, bf16* out) {
  float acc[LANES] = {0};
  for (int64_t d = 0; d < dim; d += LANES)
    for (int l = 0; l < LANES; ++l) acc[l] = std::fma(x[d + l], x[d + l], acc[l]);
  const float r = 1.0f / std::sqrt(lane_sum(acc) / static_cast<float>(dim) + eps);
  for (int64_t d = 0; d < dim; ++d) out[d] = bf16((x[d] * r) * w[d]);
}

// ggml's rotation of adjacent pairs: (a, b) -> (a cos - b sin, a sin + b cos)
inline void rotate(float* v, const float* cos_sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = v[2 * i], b = v[2 * i + 1], c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
    v[2 * i] = a * c - b * s;
    v[2 * i + 1] = a * s + b * c;
  }
}

// One query head over the keys it sees (slots idx[0..count), or 0..count when idx is null), ascending.
void attend(const float* q, const float* keys, const float* values, int64_t hd, const int32_t* idx,
            int64_t count, float scale, float* scores, float* out) {
  float top = -INFINITY;
  for (int64_t j = 0; j < count; ++j) {
    const int64_t slot = idx ? idx[j] : j;
    const float s = dot(q, keys + slot * hd, hd) * scale;
    scores[j] = s;
    top = std::max(top, s);
  }
  float acc[LANES] = {0};
  int64_t j = 0;
  for (; j + LANES <= count; j += LANES)
    for (int l = 0; l < LANES; ++l) {
      const float p = exp_approx(scores[j + l] - top);
      scores[j + l] = p;
      acc[l] += p;
    }
  for (int l = 0; j < count; ++j, ++l) {
    const float p = exp_approx(scores[j] - top);
    scores[j] = p;
    acc[l] += p;
  }
  const float inv = 1.0f / lane_sum(acc);
  for (int64_t d = 0; d < hd; ++d) out[d] = 0.0f;
  for (int64_t k = 0; k < count; ++k) {
    const float* v = values + (idx ? idx[k] : k) * hd;
    const float p = scores[k];
    for (int64_t d = 0; d < hd; ++d) out[d] = std::fma(p, v[d], out[d]);
  }
  for (int64_t d = 0; d < hd; ++d) out[d] *= inv;
}

struct Linear {
  Tensor packed, scales_zeros;
  Tensor operator()(const Tensor& x) const {
    return at::_weight_int4pack_mm_for_cpu(x, packed, 32, scales_zeros);
  }
};

struct Layer {
  Tensor attn_norm, ffn_norm;
  Linear qkv, out, gate_up, down;
};

class Cancelled : public std::exception {
 public:
  const char* what() const noexcept override { return "cancelled"; }
};

class CancelPoll {
 public:
  explicit CancelPoll(py::object check) : check_(std::move(check)), last_(clock::now()) {}
  void operator()() {
    if (check_.is_none()) return;
    const auto now = clock::now();
    if (std::chrono::duration<double, std::milli>(now - last_).count() < CANCEL_POLL_MS) return;
    last_ = now;
    bool stop;
    {
      py::gil_scoped_acquire gil;
      stop = check_().cast<bool>();
    }
    if (stop) throw Cancelled();
  }
 private:
  using clock = std::chrono::steady_clock;
  py::object check_;
  clock::time_point last_;
};

class Forward {
 public:
  Forward(int64_t dim, int64_t hidden, int64_t heads, int64_t kv_heads, double eps, std::vector<Tensor> layers,
          Tensor norm, Tensor head_hi_packed, Tensor head_hi_sz, Tensor head_lo_packed, Tensor head_lo_sz,
          Tensor embed_codes, Tensor embed_scales)
      : dim_(dim), hidden_(hidden), nq_(heads), nkv_(kv_heads), hd_(dim / heads), eps_(static_cast<float>(eps)),
        norm_(norm.contiguous()), head_hi_{head_hi_packed, head_hi_sz}, head_lo_{head_lo_packed, head_lo_sz},
        embed_codes_(embed_codes.contiguous()), embed_scales_(embed_scales.contiguous()) {
    TORCH_CHECK(layers.size() % 10 == 0, "10 tensors a layer");
    TORCH_CHECK(dim % LANES == 0 && hd_ % LANES == 0 && hd_ % 2 == 0 && heads % kv_heads == 0,
                "the native forward needs dim and head_dim in multiples of 16");
    for (size_t i = 0; i < layers.size(); i += 10)
      layers_.push_back(Layer{layers[i].contiguous(), layers[i + 1].contiguous(), {layers[i + 2], layers[i + 3]},
                              {layers[i + 4], layers[i + 5]}, {layers[i + 6], layers[i + 7]},
                              {layers[i + 8], layers[i + 9]}});
  }

  // Rows fed at cache slots start..start+n, one at a time wherever rows meet (attention); logits of
  // the last `keep` rows. positions: each row's rotary position; allowed: (n, start+n) bool or None
  // (causal); rope: (positions, head_dim/2, 2) cos/sin.
  Tensor rows(const Tensor& ids, const Tensor& keys, const Tensor& values, int64_t start, const Tensor& positions,
              const c10::optional<Tensor>& allowed, const Tensor& rope, int64_t keep, py::object cancel) {
    const int64_t n = ids.size(0);
    TORCH_CHECK(keys.is_contiguous() && values.is_contiguous() && keys.scalar_type() == at::kFloat,
                "the KV cache must be contiguous float32");
    TORCH_CHECK(start + n <= keys.size(2), "the KV cache has no room for the rows");
    TORCH_CHECK(keep >= 1 && keep <= n, "keep must be between 1 and the rows");
    CancelPoll poll(std::move(cancel));
    std::vector<std::vector<int32_t>> visible(n);
    if (allowed.has_value()) {
      const Tensor mask = allowed->to(at::kBool).contiguous();
      TORCH_CHECK(mask.size(0) == n && mask.size(1) == start + n, "allowed must be (rows, start + rows)");
      const bool* m = mask.data_ptr<bool>();
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t j = 0; j < start + n; ++j)
          if (m[r * (start + n) + j]) visible[r].push_back(static_cast<int32_t>(j));
        TORCH_CHECK(!visible[r].empty(), "a row that sees no key");
      }
    }
    py::gil_scoped_release nogil;
    Tensor x = embed(ids);
    const Tensor pos = positions.to(at::kLong).contiguous();
    const Tensor cs = rope.contiguous();
    TORCH_CHECK(pos.size(0) == n && cs.size(1) * 2 == hd_, "positions and rope do not fit the rows");
    const int64_t* p = pos.data_ptr<int64_t>();
    for (int64_t r = 0; r < n; ++r) TORCH_CHECK(p[r] >= 0 && p[r] < cs.size(0), "a position beyond the rope table");
    const float* cos_sin = cs.data_ptr<float>();
    const int64_t cap = keys.size(2), half = hd_ / 2;
    const int64_t q_end = nq_ * hd_, k_end = (nq_ + nkv_) * hd_, width = (nq_ + 2 * nkv_) * hd_;
    Tensor xn = at::empty({n, dim_}, at::kBFloat16);
    Tensor attn = at::empty({n, q_end}, at::kBFloat16);
    Tensor act = at::empty({n, hidden_}, at::kBFloat16);
    std::vector<float> qk(n * k_end), heads(n * q_end);
    float* xs = x.data_ptr<float>();
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd_));
    int64_t work = 0;
    for (int64_t r = 0; r < n; ++r) work += allowed.has_value() ? visible[r].size() : start + r + 1;
    work *= nq_;
    for (size_t i = 0; i < layers_.size(); ++i) {
      poll();
      const Layer& L = layers_[i];
      norm_rows(xs, L.attn_norm, n, xn);
      const Tensor qkv = L.qkv(xn);
      const bf16* y = qkv.data_ptr<bf16>();
      float* kc = keys.data_ptr<float>() + i * nkv_ * cap * hd_;
      float* vc = values.data_ptr<float>() + i * nkv_ * cap * hd_;
      for (int64_t r = 0; r < n; ++r) {
        float* row = qk.data() + r * k_end;
        const bf16* yr = y + r * width;
        for (int64_t c = 0; c < k_end; ++c) row[c] = static_cast<float>(yr[c]);
        for (int64_t h = 0; h < nq_ + nkv_; ++h) rotate(row + h * hd_, cos_sin + p[r] * hd_, half);
        for (int64_t g = 0; g < nkv_; ++g) {
          float* kd = kc + (g * cap + start + r) * hd_;
          float* vd = vc + (g * cap + start + r) * hd_;
          std::memcpy(kd, row + q_end + g * hd_, hd_ * sizeof(float));
          for (int64_t d = 0; d < hd_; ++d) vd[d] = static_cast<float>(yr[k_end + g * hd_ + d]);
        }
      }
      const int64_t rep = nq_ / nkv_;
      auto task = [&](int64_t begin, int64_t end) {
        std::vector<float> scores;
        for (int64_t t = begin; t < end; ++t) {
          const int64_t r = t / nq_, h = t % nq_, g = h / rep;
          const bool masked = allowed.has_value();
          const int64_t count = masked ? static_cast<int64_t>(visible[r].size()) : start + r + 1;
          scores.resize(count);
          attend(qk.data() + r * k_end + h * hd_, kc + g * cap * hd_, vc + g * cap * hd_, hd_,
                 masked ? visible[r].data() : nullptr, count, scale, scores.data(), heads.data() + r * q_end + h * hd_);
        }
      };
      if (work < PARALLEL_KEYS) task(0, n * nq_);
      else at::parallel_for(0, n * nq_, 1, task);
      bf16* a = attn.data_ptr<bf16>();
      for (int64_t c = 0; c < n * q_end; ++c) a[c] = bf16(heads[c]);
      add_rows(xs, L.out(attn), n, dim_);
      norm_rows(xs, L.ffn_norm, n, xn);
      swiglu(L.gate_up(xn), n, act);
      add_rows(xs, L.down(act), n, dim_);
    }
    return head(xs + (n - keep) * dim_, keep);
  }

  // The prompt's chunks (absolute positions, consecutive from the first chunk's start), layers outer:
  // each chunk's rows attend in one batched call (at::scaled_dot_product_attention, causal over the
  // keys before them and each other), their matmuls run on the bfloat16 weights `dense` (4 a layer).
  // The logits after the last row.
  Tensor chunks(const Tensor& ids, const Tensor& keys, const Tensor& values, const std::vector<int64_t>& cuts,
                const Tensor& rope, const std::vector<Tensor>& dense, py::object cancel) {
    TORCH_CHECK(cuts.size() >= 2 && dense.size() == layers_.size() * 4, "chunks needs cuts and 4 weights a layer");
    const int64_t start = cuts.front(), end = cuts.back(), n = ids.size(0);
    TORCH_CHECK(end - start == n && end <= keys.size(2) && end <= rope.size(0), "the chunks do not fit the rows");
    CancelPoll poll(std::move(cancel));
    py::gil_scoped_release nogil;
    Tensor x = embed(ids);
    float* xs = x.data_ptr<float>();
    const Tensor cs = rope.contiguous();
    const float* cos_sin = cs.data_ptr<float>();
    const int64_t cap = keys.size(2), half = hd_ / 2;
    const int64_t q_end = nq_ * hd_, k_end = (nq_ + nkv_) * hd_;
    std::vector<Tensor> masks;
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      const int64_t s = cuts[c], e = cuts[c + 1];
      masks.push_back(at::arange(e).unsqueeze(0).le(at::arange(s, e).unsqueeze(1)));
    }
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& L = layers_[i];
      const Tensor &w_qkv = dense[4 * i], &w_out = dense[4 * i + 1], &w_gu = dense[4 * i + 2], &w_down = dense[4 * i + 3];
      const Tensor kl = keys.select(0, i), vl = values.select(0, i);
      float* kc = kl.data_ptr<float>();
      float* vc = vl.data_ptr<float>();
      for (size_t c = 0; c + 1 < cuts.size(); ++c) {
        poll();
        const int64_t s = cuts[c], e = cuts[c + 1], m = e - s;
        float* xc = xs + (s - start) * dim_;
        Tensor xn = at::empty({m, dim_}, at::kBFloat16);
        norm_rows(xc, L.attn_norm, m, xn);
        const Tensor qkv = at::linear(xn, w_qkv);
        const bf16* y = qkv.data_ptr<bf16>();
        const int64_t width = qkv.size(1);
        Tensor q = at::empty({1, nq_, m, hd_}, at::kFloat);
        float* qd = q.data_ptr<float>();
        std::vector<float> row(k_end);
        for (int64_t r = 0; r < m; ++r) {
          const bf16* yr = y + r * width;
          for (int64_t c2 = 0; c2 < k_end; ++c2) row[c2] = static_cast<float>(yr[c2]);
          for (int64_t h = 0; h < nq_ + nkv_; ++h) rotate(row.data() + h * hd_, cos_sin + (s + r) * hd_, half);
          for (int64_t h = 0; h < nq_; ++h) std::memcpy(qd + (h * m + r) * hd_, row.data() + h * hd_, hd_ * sizeof(float));
          for (int64_t g = 0; g < nkv_; ++g) {
            std::memcpy(kc + (g * cap + s + r) * hd_, row.data() + q_end + g * hd_, hd_ * sizeof(float));
            float* vd = vc + (g * cap + s + r) * hd_;
            for (int64_t d = 0; d < hd_; ++d) vd[d] = static_cast<float>(yr[k_end + g * hd_ + d]);
          }
        }
        // contiguous: the same bits whatever the cache's capacity
        const Tensor kk = kl.narrow(1, 0, e).contiguous().unsqueeze(0), vv = vl.narrow(1, 0, e).contiguous().unsqueeze(0);
        const Tensor out = at::scaled_dot_product_attention(q, kk, vv, masks[c], 0.0, false, c10::nullopt, true);
        const Tensor a = out.select(0, 0).transpose(0, 1).reshape({m, q_end}).to(at::kBFloat16);
        add_rows(xc, at::linear(a, w_out), m, dim_);
        norm_rows(xc, L.ffn_norm, m, xn);
        Tensor act = at::empty({m, hidden_}, at::kBFloat16);
        swiglu(at::linear(xn, w_gu), m, act);
        add_rows(xc, at::linear(act, w_down), m, dim_);
      }
    }
    return head(xs + (n - 1) * dim_, 1).select(0, 0);
  }

  // Logits of rows fed alone from an empty cache are what `rows` gives: exposed for tests of the parts.
  Tensor norm_bf16(const Tensor& x, const Tensor& w) {
    Tensor xc = x.contiguous().to(at::kFloat);
    Tensor out = at::empty({xc.size(0), dim_}, at::kBFloat16);
    norm_rows(xc.data_ptr<float>(), w.contiguous(), xc.size(0), out);
    return out;
  }

 private:
  Tensor embed(const Tensor& ids) const {
    const Tensor t = ids.to(at::kLong).contiguous();
    const int64_t n = t.size(0), vocab = embed_codes_.size(0), blocks = dim_ / 32;
    Tensor x = at::empty({n, dim_}, at::kFloat);
    const int64_t* id = t.data_ptr<int64_t>();
    const int8_t* codes = embed_codes_.data_ptr<int8_t>();
    const float* sc = embed_scales_.data_ptr<float>();
    float* out = x.data_ptr<float>();
    for (int64_t r = 0; r < n; ++r) {
      TORCH_CHECK(id[r] >= 0 && id[r] < vocab, "a token id outside the vocabulary");
      for (int64_t d = 0; d < dim_; ++d)
        out[r * dim_ + d] = static_cast<float>(codes[id[r] * dim_ + d]) * sc[id[r] * blocks + d / 32];
    }
    return x;
  }

  void norm_rows(const float* x, const Tensor& w, int64_t n, Tensor& out) const {
    bf16* o = out.data_ptr<bf16>();
    const float* wd = w.data_ptr<float>();
    for (int64_t r = 0; r < n; ++r) rms_norm_bf16(x + r * dim_, wd, dim_, eps_, o + r * dim_);
  }

  static void add_rows(float* x, const Tensor& y, int64_t n, int64_t dim) {
    const Tensor yc = y.contiguous();
    const bf16* v = yc.data_ptr<bf16>();
    for (int64_t c = 0; c < n * dim; ++c) x[c] += static_cast<float>(v[c]);
  }

  // silu(gate) * up as torch computes it on bfloat16 tensors: each result rounded to bfloat16
  void swiglu(const Tensor& gate_up, int64_t n, Tensor& out) const {
    const Tensor gu = gate_up.contiguous();
    const bf16* g = gu.data_ptr<bf16>();
    bf16* o = out.data_ptr<bf16>();
    for (int64_t r = 0; r < n; ++r) {
      const bf16* gr = g + r * 2 * hidden_;
      for (int64_t c = 0; c < hidden_; ++c) {
        const float a = static_cast<float>(gr[c]);
        const float s = static_cast<float>(bf16(a / (1.0f + exp_approx(-a))));
        o[r * hidden_ + c] = bf16(s * static_cast<float>(gr[hidden_ + c]));
      }
    }
  }

  Tensor head(const float* x, int64_t rows) const {
    Tensor xn = at::empty({rows, dim_}, at::kBFloat16);
    norm_rows(x, norm_, rows, xn);
    const Tensor hi = head_hi_(xn), lo = head_lo_(xn);
    Tensor logits = at::empty({rows, hi.size(1)}, at::kFloat);
    const bf16* a = hi.data_ptr<bf16>();
    const bf16* b = lo.data_ptr<bf16>();
    float* o = logits.data_ptr<float>();
    for (int64_t c = 0; c < logits.numel(); ++c) o[c] = static_cast<float>(a[c]) + static_cast<float>(b[c]);
    return logits;
  }

  int64_t dim_, hidden_, nq_, nkv_, hd_;
  float eps_;
  Tensor norm_;
  Linear head_hi_, head_lo_;
  Tensor embed_codes_, embed_scales_;
  std::vector<Layer> layers_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::register_exception<Cancelled>(m, "Cancelled");
  py::class_<Forward>(m, "Forward")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, double, std::vector<Tensor>, Tensor, Tensor, Tensor, Tensor,
                    Tensor, Tensor, Tensor>())
      .def("rows", &Forward::rows)
      .def("chunks", &Forward::chunks)
      .def("norm_bf16", &Forward::norm_bf16);
}
