// Starts Swagger UI on /docs (kept out of the HTML: the CSP allows no inline script).
window.addEventListener("DOMContentLoaded", () => {
  "use strict";
  const root = document.getElementById("swagger-ui");
  window.ui = window.SwaggerUIBundle({
    url: root.dataset.openapiUrl,
    dom_id: "#swagger-ui",
    deepLinking: true,
    persistAuthorization: false,
    // no validator.swagger.io badge: it would call out to the internet
    validatorUrl: null,
  });
});
