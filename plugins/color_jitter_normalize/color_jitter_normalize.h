// crossdali.ColorJitterNormalize: SSD's colour jitter and normalisation in one pass over the image.
//
// The detection train pipeline spells it with three DALI operators, each a full pass that writes
// an intermediate image:
//     fn.hsv(hue, saturation) -> fn.brightness_contrast(brightness, contrast)
//     -> fn.crop_mirror_normalize(mean, std, mirror, output_layout="CHW", dtype=FLOAT)
// This operator reads each uint8 HWC pixel once and writes the normalised float, rounding to uint8
// where those operators round (after hsv, after brightness_contrast), with the arithmetic written
// the way DALI writes it (the hsv matrix of DALI's own colour headers, brightness_contrast's
// multiplier and addend, crop_mirror_normalize's mean and reciprocal std): on the CPU the result
// is bit-identical to the three operators (tests/common/test_custom_operator.py).
#ifndef CROSSDALI_PLUGINS_COLOR_JITTER_NORMALIZE_H_
#define CROSSDALI_PLUGINS_COLOR_JITTER_NORMALIZE_H_

#include <string>
#include <vector>

#include "dali/core/convert.h"
#include "dali/core/geom/mat.h"
#include "dali/operators/image/color/color_twist.h"  // Rgb2Yiq, Yiq2Rgb, hue_mat, sat_mat: fn.hsv's matrix
#include "dali/pipeline/operator/arg_helper.h"
#include "dali/pipeline/operator/checkpointing/stateless_operator.h"
#include "dali/pipeline/operator/operator.h"

namespace crossdali {

constexpr int kChannels = 3;

// Everything one sample needs, computed on the host from the per-sample arguments.
struct JitterParams {
  dali::mat3 hsv;        // fn.hsv's colour matrix (rounding to uint8 follows)
  float multiplier;      // fn.brightness_contrast: out = in * multiplier + addend (rounding follows)
  float addend;
  float mean[kChannels];     // fn.crop_mirror_normalize: (in - mean) * inv_std
  float inv_std[kChannels];
  bool mirror;           // horizontal flip
};

// The hsv matrix exactly as DALI composes it for fn.hsv (brightness, contrast and value 1), the
// multiply-add of fn.brightness_contrast for uint8 (contrast centre 128, no brightness shift), and
// crop_mirror_normalize's mean and 1/std (computed in double, stored as float).
inline JitterParams MakeJitterParams(float hue, float saturation, float brightness, float contrast, bool mirror,
                                     const std::vector<float> &mean, const std::vector<float> &std) {
  using namespace dali::color;  // NOLINT
  JitterParams p;
  p.hsv = dali::mat3(1.f) * dali::mat3(1.f) * Yiq2Rgb * hue_mat(hue) * sat_mat(saturation) * dali::mat3(1.f) *
          Rgb2Yiq;
  const float centre = 128.f, shift = 0.f, range = 255.f;
  p.addend = shift * range + brightness * (centre - contrast * centre);
  p.multiplier = brightness * contrast;
  for (int c = 0; c < kChannels; c++) {
    double m = mean.size() == 1 ? mean[0] : mean[c];
    double s = std.size() == 1 ? std[0] : std[c];
    p.mean[c] = static_cast<float>(m);
    p.inv_std[c] = static_cast<float>(1.0f / s);
  }
  p.mirror = mirror;
  return p;
}

// dali::ConvertSat<uint8_t>(x) on the CPU, clamp(std::round(x)) (halves away from zero), without a call to
// round: for 0.5 <= x < 254.5, truncating x + 0.5f gives the same integer (checked for every such float).
inline uint8_t RoundToUint8(float x) {
  return x < 0.5f ? 0 : x >= 254.5f ? 255 : static_cast<uint8_t>(static_cast<int>(x + 0.5f));
}

// fn.hsv of one pixel, rounded to uint8 as fn.hsv rounds (on the GPU DALI rounds halves to even).
DALI_HOST_DEV inline void HsvPixel(const JitterParams &p, const uint8_t *in, uint8_t out[kChannels]) {
  dali::vec3 rgb(in[0], in[1], in[2]);
  dali::vec3 twisted = p.hsv * rgb + dali::vec3(0.f);  // fn.hsv adds a zero offset (contrast 1)
  for (int c = 0; c < kChannels; c++) {
#ifdef __CUDA_ARCH__
    out[c] = dali::ConvertSat<uint8_t>(twisted[c]);
#else
    out[c] = RoundToUint8(twisted[c]);
#endif
  }
}

// fn.brightness_contrast (rounded to uint8) then fn.crop_mirror_normalize of channel c's value v after hsv.
// Both depend on that uint8 value alone, so the operator tabulates them: 256 floats per channel and
// sample, computed with the very expressions of DALI's operators, then one lookup per value.
DALI_HOST_DEV inline float LevelsNormalize(const JitterParams &p, int v, int c) {
  uint8_t levelled = dali::ConvertSat<uint8_t>(v * p.multiplier + p.addend);
  return (static_cast<float>(levelled) - p.mean[c]) * p.inv_std[c];
}

template <typename Backend>
class ColorJitterNormalize : public dali::StatelessOperator<Backend> {
 public:
  explicit ColorJitterNormalize(const dali::OpSpec &spec)
      : dali::StatelessOperator<Backend>(spec),
        mean_(spec.GetRepeatedArgument<float>("mean")),
        std_(spec.GetRepeatedArgument<float>("std")) {
    DALI_ENFORCE((mean_.size() == 1 || mean_.size() == kChannels) && (std_.size() == 1 || std_.size() == kChannels),
                 "mean and std must each have 1 or 3 values");
  }

 protected:
  bool SetupImpl(std::vector<dali::OutputDesc> &output_desc, const dali::Workspace &ws) override {
    const auto &input = ws.Input<Backend>(0);
    DALI_ENFORCE(input.type() == DALI_UINT8, "crossdali.color_jitter_normalize takes uint8 images");
    auto in_shape = input.shape();
    int n = in_shape.num_samples();
    DALI_ENFORCE(in_shape.sample_dim() == 3, "crossdali.color_jitter_normalize takes HWC images");
    dali::TensorListShape<3> out_shape(n);
    for (int i = 0; i < n; i++) {
      auto s = in_shape.tensor_shape_span(i);
      DALI_ENFORCE(s[2] == kChannels, "crossdali.color_jitter_normalize takes 3-channel (RGB) images");
      out_shape.set_tensor_shape(i, dali::TensorShape<3>(kChannels, s[0], s[1]));
    }
    auto pairs = dali::uniform_list_shape<1>(n, dali::TensorShape<1>(2));
    hsv_.Acquire(this->spec_, ws, n, pairs);
    levels_.Acquire(this->spec_, ws, n, pairs);
    std::vector<int> mirror;
    this->GetPerSampleArgument(mirror, "mirror", ws, n);
    params_.resize(n);
    for (int i = 0; i < n; i++) {
      const float *hsv = hsv_[i].data, *levels = levels_[i].data;
      params_[i] = MakeJitterParams(hsv[0], hsv[1], levels[0], levels[1], mirror[i] != 0, mean_, std_);
    }
    output_desc.resize(1);
    output_desc[0] = {out_shape, DALI_FLOAT};
    return true;
  }

  void RunImpl(dali::Workspace &ws) override;

  dali::ArgValue<float, 1> hsv_{"hsv", this->spec_}, levels_{"levels", this->spec_};
  std::vector<float> mean_, std_;
  std::vector<JitterParams> params_;
};

}  // namespace crossdali

#endif  // CROSSDALI_PLUGINS_COLOR_JITTER_NORMALIZE_H_
