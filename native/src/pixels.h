// layoutPixels(src, out, options): the layout pass of preprocessing (8-bit pixels → the encoder's
// float tensor) on a libuv worker thread. See pixels.cc.
#pragma once

#include <napi.h>

namespace percept {

Napi::Value LayoutPixels(const Napi::CallbackInfo & info);

}  // namespace percept
