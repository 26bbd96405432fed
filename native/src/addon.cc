#include <napi.h>
#include "llama.h"
static Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("version", Napi::String::New(env, "placeholder"));
  return exports;
}
NODE_API_MODULE(percept, Init)
