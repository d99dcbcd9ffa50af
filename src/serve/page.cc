// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The web view at / (or /_dedup/ in proxy mode): plain HTML, CSS and JavaScript
// from src/serve/assets/, served from the binary. It reads the same API as any
// client, so what it shows is what /v1 answers. The Content-Security-Policy
// allows scripts and styles from this origin only: even a key that slipped into
// the page as markup could not run.

#include <cstring>

#include "serve/assets.h"
#include "serve/impl.h"

namespace dedup::serve {
namespace {

void SecurityHeaders(httplib::Response& res) {
  res.set_header("Content-Security-Policy",
                 "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                 "img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'");
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Referrer-Policy", "no-referrer");
  res.set_header("Cache-Control", "no-store");
}

const Asset* Find(const char* name) {
  for (const Asset* a = kAssets; a->name != nullptr; ++a) {
    if (std::strcmp(a->name, name) == 0) return a;
  }
  return nullptr;
}

}  // namespace

void Server::Impl::RegisterPage() {
  for (const char* name : {"app.js", "style.css"}) {
    const Asset* a = Find(name);
    http.Get(base + "/assets/" + name, [a](const httplib::Request&, httplib::Response& res) {
      SecurityHeaders(res);
      res.set_content(a->content, a->content_type);
    });
  }
  const Asset* index = Find("index.html");
  http.Get(base + "/", [index](const httplib::Request&, httplib::Response& res) {
    SecurityHeaders(res);
    res.set_content(index->content, index->content_type);
  });
  if (!base.empty()) {
    http.Get(base, [b = base](const httplib::Request&, httplib::Response& res) {
      res.set_redirect(b + "/", 301);
    });
  }
}

}  // namespace dedup::serve
