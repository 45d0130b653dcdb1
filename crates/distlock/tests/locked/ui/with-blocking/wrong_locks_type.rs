struct App {
    pool: String,
}

impl App {
    #[distlock::locked(locks = self.pool, name = "report")]
    async fn report(&self) -> distlock::Result<()> {
        Ok(())
    }
}

fn main() {}
