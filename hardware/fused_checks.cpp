// The checks of a write in one call: its bytes read once from memory (and once more from the cache for the
// sum). hardware/fused_checks.py builds and calls this; the definition is tensor_checks.reference's, which the
// tests compare with this bit for bit:
//   words   the wrapping int64 sum of the bytes read as their widest words (the digest's)
//   nan     NaN elements; finite: finite elements (the others are infinities)
//   lo, hi  the smallest and largest finite element, as doubles (inf, -inf when none is finite)
//   qsum    the sum of round_half_even(v * 2^k) over the finite elements v (as doubles), k chosen from n and
//           max(|lo|, |hi|) so that no term exceeds 2^50 and their int64 sum cannot overflow: integers add up
//           to the same total in any order, so the mean does not depend on threads, chip or kernel.
// The words and the extremes are taken chunk by chunk, each chunk read once from memory, assuming every
// element finite (a write with a NaN or an infinity is counted again); the quantised sum needs the extremes
// first and reads the bytes again (from the cache, for most writes). The extremes go through vectors (GCC
// vector extensions: the compiler does not vectorise a float min without leave to ignore NaNs); the sum is a
// plain loop the compiler vectorises for whatever the chip has.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace {

enum Kind { F32, F64, F16, BF16, LUT8, I8, U8, I16, I32, I64, U16, U32, U64 };
constexpr int SIZE[] = {4, 8, 2, 2, 1, 1, 1, 2, 4, 8, 2, 4, 8};
constexpr bool floating(int k) { return k <= LUT8; }  // an integer is finite, and its quick pass never fails

template <class S>
inline S bits_at(const unsigned char* p) {
  S s;
  std::memcpy(&s, p, sizeof s);
  return s;
}

inline float float_of_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// float16 by its bits: the exponent rebiased, a subnormal by one exact float subtraction, infinities and NaNs
// kept (ryg's half_to_float_fast5)
inline float half(uint16_t h) {
  uint32_t o = (uint32_t)(h & 0x7fff) << 13;
  uint32_t exp = o & (0x7c00u << 13);
  o += (127 - 15) << 23;
  if (exp == (0x7c00u << 13)) o += (128 - 16) << 23;  // infinity, NaN: the widest exponent
  float f = float_of_bits(o);
  if (exp == 0) f = float_of_bits(o + (1 << 23)) - 6.103515625e-05f;  // 2^-14
  uint32_t out;
  std::memcpy(&out, &f, sizeof out);
  return float_of_bits(out | (uint32_t)(h & 0x8000) << 16);
}

// Element i from p as a double (exact, but for int64/uint64 beyond 2^53, which round to nearest as torch's
// .double() does). A one-byte float goes through its table of 256 floats.
template <int K>
inline double element(const unsigned char* p, int64_t i, const float* lut) {
  const unsigned char* at = p + i * SIZE[K];
  if constexpr (K == F32) return bits_at<float>(at);
  if constexpr (K == F64) return bits_at<double>(at);
  if constexpr (K == F16) return half(bits_at<uint16_t>(at));
  if constexpr (K == BF16) return float_of_bits((uint32_t)bits_at<uint16_t>(at) << 16);
  if constexpr (K == LUT8) return lut[*at];
  if constexpr (K == I8) return bits_at<int8_t>(at);
  if constexpr (K == U8) return bits_at<uint8_t>(at);
  if constexpr (K == I16) return bits_at<int16_t>(at);
  if constexpr (K == I32) return bits_at<int32_t>(at);
  if constexpr (K == I64) return (double)bits_at<int64_t>(at);
  if constexpr (K == U16) return bits_at<uint16_t>(at);
  if constexpr (K == U32) return bits_at<uint32_t>(at);
  if constexpr (K == U64) return (double)bits_at<uint64_t>(at);
}

#if defined(__AVX512F__)
constexpr int BYTES = 64;  // the widest vector the chip has: a wider one is split into slow halves
#elif defined(__AVX__)
constexpr int BYTES = 32;
#else
constexpr int BYTES = 16;
#endif

template <class T>
struct V {  // a vector of T (float for the dtypes a float holds exactly, else double) and its mask
  static constexpr int N = BYTES / sizeof(T);
  typedef T vec __attribute__((vector_size(BYTES)));
  typedef std::conditional_t<sizeof(T) == 4, int32_t, int64_t> I;
  typedef I mask __attribute__((vector_size(BYTES)));
};

template <class S, class T>
inline typename V<T>::vec convert(const unsigned char* p) {
  typedef S sv __attribute__((vector_size(V<T>::N * sizeof(S))));
  sv raw;
  std::memcpy(&raw, p, sizeof raw);
  return __builtin_convertvector(raw, typename V<T>::vec);
}

// float16 as `half` converts it, a vector at a time
template <class T, class H = uint16_t, class W = uint32_t, class F = float>  // dependent, or GCC drops the sizes
inline typename V<T>::vec halves(const unsigned char* p) {
  typedef H hv __attribute__((vector_size(V<T>::N * sizeof(H))));
  typedef W wv __attribute__((vector_size(V<T>::N * sizeof(W))));
  typedef F fv __attribute__((vector_size(V<T>::N * sizeof(F))));
  hv raw;
  std::memcpy(&raw, p, sizeof raw);
  wv h = __builtin_convertvector(raw, wv);
  wv o = (h & 0x7fff) << 13;
  wv exp = o & (0x7c00u << 13);
  o += (127 - 15) << 23;
  o += (exp == (0x7c00u << 13)) & ((128 - 16) << 23);
  wv sub = exp == 0;
  fv f, g, tiny = {};
  wv shifted = o + (1 << 23), gbits;
  std::memcpy(&g, &shifted, sizeof g);
  g -= tiny + 6.103515625e-05f;
  std::memcpy(&gbits, &g, sizeof gbits);
  o = ((sub & gbits) | (~sub & o)) | (h & 0x8000) << 16;
  std::memcpy(&f, &o, sizeof f);
  return __builtin_convertvector(f, typename V<T>::vec);
}

// V<T>::N elements from p as T: a vector conversion where the chip has one, else element by element.
template <int K, class T>
inline typename V<T>::vec load(const unsigned char* p, const float* lut) {
  if constexpr (K == F32) return convert<float, T>(p);
  if constexpr (K == F64) return convert<double, T>(p);
  if constexpr (K == I8) return convert<int8_t, T>(p);
  if constexpr (K == U8) return convert<uint8_t, T>(p);
  if constexpr (K == I16) return convert<int16_t, T>(p);
  if constexpr (K == I32) return convert<int32_t, T>(p);
  if constexpr (K == I64) return convert<int64_t, T>(p);
  if constexpr (K == U16) return convert<uint16_t, T>(p);
  if constexpr (K == U32) return convert<uint32_t, T>(p);
  if constexpr (K == U64) return convert<uint64_t, T>(p);
  if constexpr (K == F16) return halves<T>(p);
  if constexpr (K == BF16 || K == LUT8) {
    typename V<T>::vec v;
    for (int i = 0; i < V<T>::N; i++) v[i] = (T)element<K>(p, i, lut);
    return v;
  }
}

// The last elements, fewer than a vector: the unused lanes repeat the first one (no new extreme, no new
// non-finite element), or with NAN_FILL are NaN (counted, and taken off again by the caller).
template <int K, class T, bool NAN_FILL>
inline typename V<T>::vec load_tail(const unsigned char* p, int64_t count, const float* lut) {
  unsigned char buf[BYTES] = {};
  for (int i = 0; i < V<T>::N; i++) std::memcpy(buf + i * SIZE[K], p + (i < count ? i : 0) * SIZE[K], SIZE[K]);
  auto v = load<K, T>(buf, lut);
  if constexpr (NAN_FILL) for (int i = count; i < V<T>::N; i++) v[i] = NAN;
  return v;
}

typedef std::integral_constant<int, 0> First;
typedef std::integral_constant<int, 1> Second;

// step(v, slot) for every vector of n elements, slot alternating between two sets of accumulators so that
// consecutive steps do not wait for each other; the last elements come as load_tail gives them. The
// accumulators are the caller's locals: the bytes are read through unsigned char*, which may alias any
// memory, so accumulators in memory would be stored and reloaded at every step.
template <int K, class T, bool NAN_FILL, class Step>
inline void for_vectors(const unsigned char* p, int64_t n, const float* lut, Step step) {
  constexpr int N = V<T>::N;
  int64_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    step(load<K, T>(p + i * SIZE[K], lut), First{});
    step(load<K, T>(p + (i + N) * SIZE[K], lut), Second{});
  }
  for (; i + N <= n; i += N) step(load<K, T>(p + i * SIZE[K], lut), First{});
  if (i < n) step(load_tail<K, T, NAN_FILL>(p + i * SIZE[K], n - i, lut), First{});
}

template <class T>
inline typename V<T>::vec splat(T x) {
  typename V<T>::vec v = {};
  return v + x;
}

template <class W>
uint64_t word_sum(const unsigned char* p, int64_t nbytes) {
  uint64_t total = 0;
  for (int64_t i = 0; i < nbytes / (int64_t)sizeof(W); i++) {
    total += (uint64_t)(int64_t)bits_at<W>(p + i * sizeof(W));  // sign-extended (uint8: zero-extended), wrapping
  }
  return total;
}

uint64_t words_of(const unsigned char* p, int64_t nbytes, int64_t width) {
  if (width == 8) return word_sum<int64_t>(p, nbytes);
  if (width == 4) return word_sum<int32_t>(p, nbytes);
  if (width == 2) return word_sum<int16_t>(p, nbytes);
  return word_sum<uint8_t>(p, nbytes);
}

struct Extremes {
  int64_t nan = 0, finite = 0;
  double lo = INFINITY, hi = -INFINITY;
};

template <class T>
void reduce(const typename V<T>::vec (&lo)[2], const typename V<T>::vec (&hi)[2], Extremes& e) {
  for (int s = 0; s < 2; s++) {
    for (int i = 0; i < V<T>::N; i++) {
      e.lo = lo[s][i] < e.lo ? (double)lo[s][i] : e.lo;
      e.hi = hi[s][i] > e.hi ? (double)hi[s][i] : e.hi;
    }
  }
}

constexpr int64_t CHUNK = 1 << 13;  // elements a chunk: its words and its extremes are read while it is cached

// The words and, assuming every element finite, the extremes. False if an element was not finite (it makes
// the sum of the elements, kept for no other reason, non-finite; a sum that overflows only costs a recount).
template <int K, class T>
bool quick_pass(const unsigned char* p, int64_t n, int64_t width, const float* lut, uint64_t& words, Extremes& e) {
  typedef typename V<T>::vec vec;
  vec lo[2] = {splat<T>(INFINITY), splat<T>(INFINITY)}, hi[2] = {splat<T>(-INFINITY), splat<T>(-INFINITY)};
  vec total[2] = {splat<T>(0), splat<T>(0)};
  for (int64_t at = 0; at < n; at += CHUNK) {
    int64_t count = std::min(CHUNK, n - at);
    words += words_of(p + at * SIZE[K], count * SIZE[K], width);
    for_vectors<K, T, false>(p + at * SIZE[K], count, lut, [&](vec v, auto s) {
      total[s] += v;
      lo[s] = v < lo[s] ? v : lo[s];  // the compare-and-select a min instruction is
      hi[s] = v > hi[s] ? v : hi[s];
    });
  }
  for (int s = 0; s < 2; s++)
    for (int i = 0; i < V<T>::N; i++)
      if (!std::isfinite(total[s][i])) return false;
  reduce<T>(lo, hi, e);
  e.finite = n;
  return true;
}

// NaN and finite counts and the extremes of the finite elements: for a write that holds a NaN or an
// infinity (a masked attention's -inf, an overflow).
template <int K, class T>
Extremes counting_pass(const unsigned char* p, int64_t n, const float* lut) {
  typedef typename V<T>::vec vec;
  typedef typename V<T>::mask mask;
  mask nan[2] = {}, finite[2] = {};
  vec lo[2] = {splat<T>(INFINITY), splat<T>(INFINITY)}, hi[2] = {splat<T>(-INFINITY), splat<T>(-INFINITY)};
  for_vectors<K, T, true>(p, n, lut, [&](vec v, auto s) {
    mask fin = (v - v) == 0;  // inf - inf and NaN - NaN are NaN
    nan[s] -= (v != v);
    finite[s] -= fin;
    vec small = fin ? v : splat<T>(INFINITY);  // a non-finite element is no candidate
    vec large = fin ? v : splat<T>(-INFINITY);
    lo[s] = small < lo[s] ? small : lo[s];
    hi[s] = large > hi[s] ? large : hi[s];
  });
  Extremes e;
  e.nan = -((V<T>::N - n % V<T>::N) % V<T>::N);  // the tail's NaN lanes
  for (int s = 0; s < 2; s++) {
    for (int i = 0; i < V<T>::N; i++) {
      e.nan += nan[s][i];
      e.finite += finite[s][i];
    }
  }
  reduce<T>(lo, hi, e);
  return e;
}

// The bits of v * s1 * s2 + 1.5 * 2^52 summed over the finite elements: s1 * s2 is 2^k, in two factors only
// where 2^k is beyond a double (the smallest float64 subnormals). |v * 2^k| <= 2^50, so the addition leaves
// round_half_even(v * 2^k) in the low bits; the caller takes the constant's bits off once per element
// (wrapping int64 arithmetic is exact modulo 2^64, and the true total fits). A fused multiply-add gives the
// same bits: v * 2^k is exact, or below 2^-1022 and rounds to 0 either way.
template <int K, bool TWO, bool MASKED>
uint64_t quantised_bits(const unsigned char* p, int64_t n, const float* lut, double s1, double s2) {
  const double magic = 6755399441055744.0;
  uint64_t total = 0;
  for (int64_t i = 0; i < n; i++) {
    double v = element<K>(p, i, lut);
    double x = v * s1;
    if constexpr (TWO) x = x * s2;
    x = x + magic;
    uint64_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    if constexpr (MASKED) total += v - v == 0 ? bits : 0;  // a non-finite v gives a non-finite x
    else total += bits;
  }
  return total;
}

int ceil_log2(int64_t n) {
  int b = 0;
  while ((int64_t(1) << b) < n) b++;
  return b;
}

// qsum and its k (see the top), from the extremes.
template <int K>
void quantise(const unsigned char* p, int64_t n, const float* lut, const Extremes& e, int64_t& qsum, int64_t& k) {
  double m = std::max(std::fabs(e.lo), std::fabs(e.hi));
  if (!e.finite || m == 0) return;
  int exponent;
  std::frexp(m, &exponent);  // m < 2^exponent
  k = std::min(50, 61 - ceil_log2(n)) - exponent;
  int64_t k1 = k <= 1023 ? k : k >> 1;  // beyond 1023 only for float64 (m < 2^-973)
  double s1 = std::ldexp(1.0, k1), s2 = std::ldexp(1.0, k - k1);
  uint64_t bits;
  if constexpr (!floating(K)) bits = quantised_bits<K, false, false>(p, n, lut, s1, s2);
  else if constexpr (K != F64) {
    bits = e.finite < n ? quantised_bits<K, false, true>(p, n, lut, s1, s2)
                        : quantised_bits<K, false, false>(p, n, lut, s1, s2);
  } else if (k1 == k) {
    bits = e.finite < n ? quantised_bits<K, false, true>(p, n, lut, s1, s2)
                        : quantised_bits<K, false, false>(p, n, lut, s1, s2);
  } else {
    bits = e.finite < n ? quantised_bits<K, true, true>(p, n, lut, s1, s2)
                        : quantised_bits<K, true, false>(p, n, lut, s1, s2);
  }
  const double magic = 6755399441055744.0;
  uint64_t magic_bits;
  std::memcpy(&magic_bits, &magic, 8);
  qsum = (int64_t)(bits - (uint64_t)e.finite * magic_bits);
}

template <int K, class T>
void run(const unsigned char* p, int64_t n, int64_t width, const float* lut, int64_t* out_i, double* out_d) {
  uint64_t words = 0;
  Extremes e;
  if (!quick_pass<K, T>(p, n, width, lut, words, e)) {
    if constexpr (floating(K)) e = counting_pass<K, T>(p, n, lut);
  }
  int64_t qsum = 0, k = 0;
  quantise<K>(p, n, lut, e, qsum, k);
  out_i[0] = (int64_t)words;
  out_i[1] = e.nan;
  out_i[2] = e.finite;
  out_i[3] = qsum;
  out_i[4] = k;
  out_d[0] = e.lo;
  out_d[1] = e.hi;
}

}  // namespace

// n elements of `kind` at data (contiguous); lut: 256 floats for a one-byte float dtype (LUT8), else unused.
// out_i: words, nan, finite, qsum, k; out_d: lo, hi. Returns 0, or 1 for an unknown kind.
extern "C" int rewind_checks(const void* data, int64_t n, int kind, const float* lut, int64_t* out_i,
                             double* out_d) {
  if (kind < F32 || kind > U64) return 1;
  const unsigned char* p = static_cast<const unsigned char*>(data);
  int64_t nbytes = n * SIZE[kind];
  int64_t width = std::min<int64_t>(nbytes & -nbytes, 8);  // chunks hold multiples of 8 bytes: whole words
  switch (kind) {
    case F32: run<F32, float>(p, n, width, lut, out_i, out_d); break;
    case F64: run<F64, double>(p, n, width, lut, out_i, out_d); break;
    case F16: run<F16, float>(p, n, width, lut, out_i, out_d); break;
    case BF16: run<BF16, float>(p, n, width, lut, out_i, out_d); break;
    case LUT8: run<LUT8, float>(p, n, width, lut, out_i, out_d); break;
    case I8: run<I8, float>(p, n, width, lut, out_i, out_d); break;
    case U8: run<U8, float>(p, n, width, lut, out_i, out_d); break;
    case I16: run<I16, float>(p, n, width, lut, out_i, out_d); break;
    case I32: run<I32, double>(p, n, width, lut, out_i, out_d); break;
    case I64: run<I64, double>(p, n, width, lut, out_i, out_d); break;
    case U16: run<U16, float>(p, n, width, lut, out_i, out_d); break;
    case U32: run<U32, double>(p, n, width, lut, out_i, out_d); break;
    case U64: run<U64, double>(p, n, width, lut, out_i, out_d); break;
  }
  return 0;
}
