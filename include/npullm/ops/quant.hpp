// Quantized weight formats, whole: their table and views (ops/quant_format.hpp; each format's
// layout, decoding and quantizer in ops/formats/<name>.hpp), decoding and the dequantize
// reference (ops/dequantize.hpp), the quantizers (ops/quantize.hpp). The fused kernels that read
// the blocks are in ops/quant_linear.hpp.
#pragma once

#include "npullm/ops/dequantize.hpp"
#include "npullm/ops/quant_format.hpp"
#include "npullm/ops/quantize.hpp"
