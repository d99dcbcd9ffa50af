// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The web page's files (src/serve/assets/), compiled into the binary.

#ifndef DEDUP_SRC_SERVE_ASSETS_H_
#define DEDUP_SRC_SERVE_ASSETS_H_

namespace dedup::serve {

struct Asset {
  const char* name;          // "index.html", "app.js", "style.css"
  const char* content_type;
  const char* content;
};

// Ends with an entry whose name is null.
extern const Asset kAssets[];

}  // namespace dedup::serve

#endif  // DEDUP_SRC_SERVE_ASSETS_H_
