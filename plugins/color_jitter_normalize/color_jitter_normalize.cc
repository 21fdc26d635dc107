// CPU implementation and the operator's schema (the schema is registered once, here).
#include "color_jitter_normalize.h"

namespace crossdali {

template <>
void ColorJitterNormalize<dali::CPUBackend>::RunImpl(dali::Workspace &ws) {
  const auto &input = ws.Input<dali::CPUBackend>(0);
  auto &output = ws.Output<dali::CPUBackend>(0);
  output.SetLayout(dali::TensorLayout("CHW"));
  auto &pool = ws.GetThreadPool();
  auto shape = input.shape();
  for (int i = 0; i < shape.num_samples(); i++) {
    auto s = shape.tensor_shape_span(i);
    int64_t h = s[0], w = s[1];
    pool.AddWork([&, i, h, w](int) {
      const uint8_t *in = input.tensor<uint8_t>(i);
      float *out = output.mutable_tensor<float>(i);
      const JitterParams &p = params_[i];
      float table[kChannels][256];
      for (int c = 0; c < kChannels; c++)
        for (int v = 0; v < 256; v++)
          table[c][v] = LevelsNormalize(p, v, c);
      const int64_t plane = h * w, step = p.mirror ? -1 : 1;
      for (int64_t y = 0; y < h; y++) {
        const uint8_t *pixel = in + y * w * kChannels;
        float *o = out + y * w + (p.mirror ? w - 1 : 0);
        for (int64_t x = 0; x < w; x++, pixel += kChannels, o += step) {
          uint8_t hsv[kChannels];
          HsvPixel(p, pixel, hsv);
          o[0] = table[0][hsv[0]];
          o[plane] = table[1][hsv[1]];
          o[2 * plane] = table[2][hsv[2]];
        }
      }
    }, h * w);
  }
  pool.RunAll();
}

}  // namespace crossdali

DALI_REGISTER_OPERATOR(crossdali__ColorJitterNormalize, ::crossdali::ColorJitterNormalize<::dali::CPUBackend>,
                       ::dali::CPU);

DALI_SCHEMA(crossdali__ColorJitterNormalize)
    .DocStr(R"(SSD's colour jitter and normalisation fused into one pass (crossdali's example plugin).

Equal to ``fn.hsv(hue, saturation)``, then ``fn.brightness_contrast(brightness, contrast)``, then
``fn.crop_mirror_normalize(mean, std, mirror, output_layout="CHW", dtype=FLOAT)`` on a uint8 HWC
RGB image, with the same roundings to uint8 between the steps; the output is float CHW.)")
    .NumInput(1)
    .NumOutput(1)
    .InputLayout(0, "HWC")
    .AddOptionalArg("hsv", "Per sample ``[hue, saturation]``: hue rotation in degrees and "
        "saturation factor, as fn.hsv's ``hue`` and ``saturation``.", std::vector<float>{0.f, 1.f}, true)
    .AddOptionalArg("levels", "Per sample ``[brightness, contrast]``, as "
        "fn.brightness_contrast's (contrast around 128).", std::vector<float>{1.f, 1.f}, true)
    .AddOptionalArg("mirror", "1: flip horizontally (as fn.crop_mirror_normalize).", 0, true)
    .AddOptionalArg("mean", "Per-channel mean subtracted after the jitter.", std::vector<float>{0.f})
    .AddOptionalArg("std", "Per-channel standard deviation divided by after the jitter.", std::vector<float>{1.f});
