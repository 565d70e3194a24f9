/* The chat page's files (web/ in the source tree), built into the binary by cmake/embed_web.cmake
 * so that `ember serve` can serve the page offline and without its sources. The arrays are
 * generated, read-only and static: nothing to free. web.c looks them up by URL path. */
#ifndef EMBER_SERVER_WEB_ASSETS_H
#define EMBER_SERVER_WEB_ASSETS_H

#include <stddef.h>

typedef struct em_web_asset {
    const char *path;         /* the URL path, "/index.html" */
    const char *content_type; /* by the file's extension */
    const unsigned char *data;
    size_t size;
} em_web_asset;

extern const em_web_asset em_web_assets[];
extern const int em_web_asset_count;

/* The asset a GET of `url` serves ("/" is /index.html; a query string is ignored); NULL if none. */
const em_web_asset *em_web_asset_find(const char *url);

#endif
