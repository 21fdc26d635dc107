// GPU implementation: one kernel launch per batch, one thread per pixel (grid-stride), one block
// row per sample. The schema is registered by the CPU file.
#include <cuda_runtime_api.h>

#include "color_jitter_normalize.h"
#include "dali/core/cuda_error.h"
#include "dali/kernels/dynamic_scratchpad.h"

namespace crossdali {

struct GpuSample {
  const uint8_t *in;
  float *out;
  int64_t height, width;
  JitterParams params;
};

__global__ void ColorJitterNormalizeKernel(const GpuSample *samples) {
  const GpuSample &s = samples[blockIdx.y];
  __shared__ float table[kChannels][256];  // brightness/contrast + normalisation of each uint8 value
  for (int v = threadIdx.x; v < 256; v += blockDim.x)
    for (int c = 0; c < kChannels; c++)
      table[c][v] = LevelsNormalize(s.params, v, c);
  __syncthreads();
  const int64_t plane = s.height * s.width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < plane;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t y = i / s.width, x = i - y * s.width;
    int64_t out_x = s.params.mirror ? s.width - 1 - x : x;
    uint8_t hsv[kChannels];
    HsvPixel(s.params, s.in + i * kChannels, hsv);
    float *o = s.out + y * s.width + out_x;
    for (int c = 0; c < kChannels; c++)
      o[c * plane] = table[c][hsv[c]];
  }
}

template <>
void ColorJitterNormalize<dali::GPUBackend>::RunImpl(dali::Workspace &ws) {
  const auto &input = ws.Input<dali::GPUBackend>(0);
  auto &output = ws.Output<dali::GPUBackend>(0);
  output.SetLayout(dali::TensorLayout("CHW"));
  auto shape = input.shape();
  int n = shape.num_samples();
  if (n == 0) return;
  std::vector<GpuSample> samples(n);
  int64_t max_plane = 1;
  for (int i = 0; i < n; i++) {
    auto s = shape.tensor_shape_span(i);
    samples[i] = {input.tensor<uint8_t>(i), output.mutable_tensor<float>(i), s[0], s[1], params_[i]};
    max_plane = std::max<int64_t>(max_plane, s[0] * s[1]);
  }
  dali::kernels::DynamicScratchpad scratchpad(ws.stream());
  const GpuSample *gpu_samples = scratchpad.ToGPU(ws.stream(), samples);
  const int block = 256;
  int64_t blocks = std::min<int64_t>((max_plane + block - 1) / block, 1024);
  dim3 grid(static_cast<unsigned>(blocks), n);
  ColorJitterNormalizeKernel<<<grid, block, 0, ws.stream()>>>(gpu_samples);
  CUDA_CALL(cudaGetLastError());
}

}  // namespace crossdali

DALI_REGISTER_OPERATOR(crossdali__ColorJitterNormalize, ::crossdali::ColorJitterNormalize<::dali::GPUBackend>,
                       ::dali::GPU);
